/* sessions.c - sessions: a long-lived shell per session, on a pty of the sandbox's own devpts
 * (the master is passed to us at start: jail/session-child.c), driven in two ways: command
 * mode (session.run, see session-run.c) and raw mode: session.write, session.output
 * notifications (seq = offset of the first byte in the session's output stream), resize,
 * signal, attach with one writer, a scrollback ring replayed on attach (session-io.c).
 *
 * This file keeps the module's state (the list of sessions), the attached clients, the
 * records that list sessions after a restart, the idle timeout, the JSON of a session and
 * the RPC handlers. See "Sessions" in docs/ARCHITECTURE.md. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "daemon/session-internal.h"
#include "daemon/sessions.h"
#include "exec/result.h"

#define SCROLLBACK_DEFAULT (1u << 20)
#define MAX_SESSIONS_PER_DAEMON 4096
#define MAX_QUEUE 256

static struct conch_list sessions = {&sessions, &sessions};
static unsigned n_sessions;
static uint64_t next_session;

static void session_unrecord(struct session *s);
static void sessions_trim(struct daemon *d);

struct session *conch_daemon_session_find(const char *id)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &sessions)
    {
        struct session *s = conch_list_entry(pos, struct session, link);
        if (!strcmp(s->id, id))
            return s;
    }
    return NULL;
}

/* Forget attached clients that went away (their sink is closed): a writer that left frees
 * the keyboard. */
static void prune_clients(struct session *s)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &s->clients)
    {
        struct sclient *c = conch_list_entry(pos, struct sclient, link);
        if (!conch_rpc_sink_ctx(c->sink)) {
            conch_list_del(&c->link);
            conch_rpc_sink_unref(c->sink);
            free(c);
        }
    }
}

void conch_daemon_session_notify_all(struct session *s, const char *method, json_t *params)
{
    prune_clients(s);
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &s->clients)
    {
        struct sclient *c = conch_list_entry(pos, struct sclient, link);
        conch_daemon_client_notify(c->sink, method, json_incref(params));
    }
    json_decref(params);
}

/* ---- records: sessions listed after a restart ---- */

/* Each session has a record in <state>/sessions/: <id>.json (what session.list shows) and
 * <id>.out (the scrollback), written on open, at its end, and at most every SAVE_MS while it
 * prints (so that a daemon killed by SIGKILL still leaves a recent scrollback). A restarted
 * daemon lists them as ended. Files, not the SQLite database: a scrollback is a blob written
 * often, and the schema stays the sandboxes'. At most MAX_RECORDS are kept (oldest ended
 * ones go first). */
#define MAX_RECORDS 256

static int records_dir(struct daemon *d, char *buf, size_t size)
{
    int n = snprintf(buf, size, "%s/sessions", d->state_dir);
    if (n < 0 || (size_t)n >= size)
        return -1;
    if (mkdir(buf, 0700) < 0 && errno != EEXIST)
        return -1;
    return 0;
}

static void write_file(const char *dir, const char *name, const char *data, size_t len)
{
    char tmp[PATH_MAX + 64], dst[PATH_MAX + 64];
    snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name);
    snprintf(dst, sizeof(dst), "%s/%s", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    int r = conch_write_all(fd, data, len);
    close(fd);
    if (r < 0 || rename(tmp, dst) < 0) {
        log_warn("session record %s: %s", dst, strerror(r < 0 ? -r : errno));
        unlink(tmp);
    }
}

static void session_save(struct session *s, bool with_scrollback)
{
    char dir[PATH_MAX];
    if (s->recovered || records_dir(s->d, dir, sizeof(dir)) < 0)
        return;
    json_t *o = conch_daemon_session_json(s);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    char name[64];
    if (text) {
        snprintf(name, sizeof(name), "%s.json", s->id);
        write_file(dir, name, text, strlen(text));
        free(text);
    }
    if (with_scrollback) {
        size_t len = 0;
        char *sbk = conch_daemon_session_ring_copy(s, &len);
        if (sbk) {
            snprintf(name, sizeof(name), "%s.out", s->id);
            write_file(dir, name, sbk, len);
            free(sbk);
        }
        s->saved_seq = s->seq;
    }
}

void conch_daemon_session_on_save(uv_timer_t *t)
{
    struct session *s = t->data;
    if (s->saved_seq != s->seq)
        session_save(s, true);
}

void conch_daemon_session_record(struct session *s)
{
    session_save(s, true);
}

static void session_unrecord(struct session *s)
{
    char dir[PATH_MAX], path[PATH_MAX + 64];
    if (records_dir(s->d, dir, sizeof(dir)) < 0)
        return;
    snprintf(path, sizeof(path), "%s/%s.json", dir, s->id);
    unlink(path);
    snprintf(path, sizeof(path), "%s/%s.out", dir, s->id);
    unlink(path);
}

/* A record of ours: never through a link planted in its place. NULL when unreadable. */
static char *read_record(const char *path, size_t max, size_t *ret_len)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    char *buf = NULL;
    *ret_len = 0;
    if (fd < 0 || conch_read_fd(fd, path, max, &buf, ret_len, NULL) < 0)
        return NULL;
    return buf;
}

/* ---- idle ---- */

static void on_idle(uv_timer_t *t)
{
    struct session *s = t->data;
    if (s->cur || !conch_list_empty(&s->queue)) {
        uv_timer_start(s->idle, on_idle, (uint64_t)(s->idle_timeout * 1000), 0);
        return;
    }
    if (s->state != SS_ENDED && s->proc_live) {
        snprintf(s->kill_reason, sizeof(s->kill_reason), "idle for %.0f s", s->idle_timeout);
        conch_super_signal(&s->proc, SIGKILL);
    }
}

/* The session (and its sandbox, whose own idle timer knows nothing of sessions) is in use. */
void conch_daemon_session_touch(struct session *s)
{
    s->last_used_at = conch_daemon_now();
    if (s->idle_timeout > 0 && s->idle)
        uv_timer_start(s->idle, on_idle, (uint64_t)(s->idle_timeout * 1000), 0);
    struct sandbox *sb = s->recovered ? NULL : sess_sb(s);
    if (sb)
        conch_daemon_sandbox_touch(sb);
}

/* ---- JSON ---- */

static int queued_count(struct session *s)
{
    int n = s->cur ? 1 : 0;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &s->queue) n++;
    return n;
}

json_t *conch_daemon_session_json(struct session *s)
{
    prune_clients(s);
    struct conch_list *pos, *tmp;
    int clients = 0, writers = 0;
    conch_list_for_each_safe(pos, tmp, &s->clients)
    {
        clients++;
        if (conch_list_entry(pos, struct sclient, link)->writer)
            writers++;
    }
    json_t *o = json_pack("{s:s,s:s,s:s,s:i,s:i,s:i,s:f,s:f,s:I,s:i,s:i}", "session", s->id,
                          "sandbox", s->sandbox_id, "state",
                          s->state == SS_ENDED  ? "ended"
                          : s->state == SS_LIVE ? "running"
                                                : "starting",
                          "clients", clients, "rows", s->rows, "cols", s->cols, "created_at",
                          s->created_at, "last_used_at", s->last_used_at, "output_bytes",
                          (json_int_t)s->seq, "shells", (int)s->shells, "queued", queued_count(s));
    if (s->state == SS_ENDED) {
        json_object_set_new(o, "reason", json_string(s->end_reason));
        json_object_set_new(o, "exit_code",
                            s->end_code >= 0 ? json_integer(s->end_code) : json_null());
    }
    json_object_set_new(o, "writer", json_boolean(writers > 0));
    return o;
}

/* Whether the viewer may see @s: a tenant sees the sessions of its own sandboxes only (an
 * ended session whose sandbox is gone is no tenant's). */
static bool session_visible(struct daemon *d, const struct session *s)
{
    if (conch_daemon_tenant_sees_tenant(d, ""))
        return true; /* the owner's connection, an admin's, or the daemon itself */
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        if (!strcmp(sb->id, s->sandbox_id))
            return !sandbox_destroyed(sb) && conch_daemon_tenant_sees(d, sb);
    }
    return false;
}

static struct session *find_or_fail(struct conch_rpc_call *call, json_t *params)
{
    const char *id = conch_rpc_str(params, "session", "");
    struct session *s = conch_daemon_session_find(id);
    if (s && !session_visible(s->d, s))
        s = NULL;
    if (!s)
        conch_rpc_call_failf(call, CONCH_RPC_JOB_NOT_FOUND, "session_not_found", NULL,
                             "no session '%s' (session.list shows them)", id);
    return s;
}

static struct sclient *client_of(struct session *s, struct conch_rpc_sink *sink)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &s->clients)
    {
        struct sclient *c = conch_list_entry(pos, struct sclient, link);
        if (c->sink == sink)
            return c;
    }
    return NULL;
}

/* The ctx of a handler is the client the request came from. */
static struct conch_rpc_sink *ctx_sink(void *ctx)
{
    struct client *c = ctx;
    return c ? c->sink : NULL;
}

/* ---- handlers ---- */

void conch_daemon_handle_session_open(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *cl = ctx;
    struct daemon *d = cl->d;
    const char *shell = conch_rpc_str(params, "shell", "bash");
    if (strcmp(shell, "bash") && strcmp(shell, "/bin/bash")) {
        conch_rpc_call_fail_param(call, "shell", "only bash is supported for now");
        return;
    }
    if (n_sessions >= MAX_SESSIONS_PER_DAEMON) {
        conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL, "too many sessions (%d)",
                             MAX_SESSIONS_PER_DAEMON);
        return;
    }
    struct sandbox *sb =
        conch_daemon_sandbox_find_running(d, call, conch_rpc_str(params, "sandbox", ""));
    if (!sb)
        return;
    struct session *s = calloc(1, sizeof(*s));
    if (!s) {
        conch_rpc_call_failf(call, -32603, "internal_error", NULL, "out of memory");
        return;
    }
    s->d = d;
    s->sock = s->master = -1;
    /* Random beside the counter: a restarted daemon counts from 1 again, and rand() unseeded
     * named every daemon's first session ses-1-4567, so that `conch attach` joined a dead one. */
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        rnd = ((uint32_t)getpid() * 0x9e3779b9u) ^ (uint32_t)(uintptr_t)&rnd;
    snprintf(s->id, sizeof(s->id), "ses-%llu-%08x", (unsigned long long)++next_session, rnd);
    snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", sb->id);
    CONCH_LIST_INIT(&s->clients);
    CONCH_LIST_INIT(&s->queue);
    s->rows = (unsigned short)conch_rpc_int(params, "rows", 24);
    s->cols = (unsigned short)conch_rpc_int(params, "cols", 80);
    /* The ring grows as output comes, charged to the sandbox's budget (session-io.c). */
    s->ring_cap = (size_t)conch_rpc_int(params, "scrollback", SCROLLBACK_DEFAULT);
    s->held_sb = sb;
    s->env = json_incref(json_object_get(params, "env"));
    const char *cwd = conch_rpc_str(params, "cwd", NULL);
    if (cwd && cwd[0] == '/')
        s->cwd = strdup(cwd);
    else if (cwd && *cwd && asprintf(&s->cwd, "/workspace/%s", cwd) < 0)
        s->cwd = NULL;
    if (!s->cwd)
        s->cwd = strdup("/workspace");
    s->idle_timeout = conch_rpc_num(params, "idle_timeout", 3600);
    s->created_at = s->last_used_at = conch_daemon_now();
    s->cap.spill_fd = s->nocap.spill_fd = -1;
    struct conch_err err = {0};
    if (conch_daemon_session_timers_open(s) < 0 || conch_daemon_session_shell_start(s, &err) < 0) {
        if (!err.code)
            conch_err_set(&err, ENOMEM, "out of memory");
        conch_daemon_session_timers_close(s);
        free(s->ring);
        free(s->cwd);
        json_decref(s->env);
        free(s);
        conch_rpc_call_fail_err(call, 0, NULL, &err);
        return;
    }
    conch_list_add(&sessions, &s->link);
    n_sessions++;
    sessions_trim(d);
    session_save(s, false);
    conch_daemon_session_touch(s);
    conch_daemon_sandbox_touch(sb);
    /* The client that opened it is attached (read-only unless it asks to write). */
    struct conch_rpc_sink *sink = ctx_sink(ctx);
    if (sink && conch_rpc_bool(params, "attach", false)) {
        struct sclient *c = calloc(1, sizeof(*c));
        if (c) {
            c->sink = conch_rpc_sink_ref(sink);
            c->writer = true;
            conch_list_add(&s->clients, &c->link);
        }
    }
    s->open_call = call; /* answered when the shell has started (or failed to) */
}

void conch_daemon_handle_session_run(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    (void)ctx;
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    size_t clen = 0, in_len = 0;
    const char *command = conch_rpc_strn(params, "command", &clen);
    if (!command || strlen(command) != clen) {
        conch_rpc_call_fail_param(call, "command", "command must be a string without NUL bytes");
        return;
    }
    const char *in = conch_rpc_strn(params, "stdin", &in_len);
    if (in && strlen(in) != in_len) {
        conch_rpc_call_fail_param(call, "stdin", "stdin must be text without NUL bytes");
        return;
    }
    unsigned queued = 0;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &s->queue) queued++;
    if (queued >= MAX_QUEUE) {
        conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL,
                             "too many commands queued on session %s (%d)", s->id, MAX_QUEUE);
        return;
    }
    struct srun *r = calloc(1, sizeof(*r));
    if (!r) {
        conch_rpc_call_failf(call, -32603, "internal_error", NULL, "out of memory");
        return;
    }
    r->s = s;
    r->call = call;
    r->command = strdup(command);
    if (in) {
        r->has_in = true;
        /* A here-string adds the final newline back. */
        if (in_len && in[in_len - 1] == '\n')
            in_len--;
        r->in = strndup(in, in_len);
        r->in_len = in_len;
    }
    double timeout = conch_rpc_num(params, "timeout", 120);
    double grace = conch_rpc_num(params, "grace", 2);
    r->timeout_ms = timeout > 0 ? (uint64_t)(timeout * 1000) : 0;
    r->grace_ms = (uint64_t)(grace * 1000);
    long long mo = conch_rpc_int(params, "max_output", 1 << 20);
    r->max_output = mo > 0 ? (size_t)mo : 1 << 20;
    conch_list_add(&s->queue, &r->link);
    conch_daemon_session_touch(s);
    conch_daemon_session_pump(s);
}

void conch_daemon_handle_session_write(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    struct conch_rpc_sink *sink = ctx_sink(ctx);
    prune_clients(s);
    struct sclient *me = client_of(s, sink);
    struct conch_list *pos, *tmp;
    bool other_writer = false;
    conch_list_for_each_safe(pos, tmp, &s->clients)
    {
        struct sclient *c = conch_list_entry(pos, struct sclient, link);
        if (c != me && c->writer)
            other_writer = true;
    }
    if (other_writer && !(me && me->writer)) {
        conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "not_writer", NULL,
                             "another client writes to session %s; take over with "
                             "session.attach {write: true}",
                             s->id);
        return;
    }
    if (s->state != SS_LIVE) {
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_STOPPED, "session_ended", NULL,
                             "session %s is not running (%s)", s->id,
                             s->state == SS_ENDED ? s->end_reason : "starting");
        return;
    }
    size_t len = 0;
    const char *data = conch_rpc_strn(params, "data", &len);
    struct conch_err err = {0};
    int r = conch_daemon_session_master_write(s, data, len, true, &err);
    if (r == -ENOBUFS || r == -ENOMEM) {
        conch_rpc_call_fail_err(call, CONCH_RPC_LIMIT, "limit", &err);
        return;
    }
    if (r < 0) {
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_STOPPED, "session_ended", NULL,
                             "session %s: write to its terminal: %s", s->id, err.msg);
        return;
    }
    conch_daemon_session_touch(s);
    conch_rpc_call_reply(call, json_pack("{s:I}", "written", (json_int_t)len));
}

void conch_daemon_handle_session_attach(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    struct conch_rpc_sink *sink = ctx_sink(ctx);
    if (!sink) {
        conch_rpc_call_failf(call, -32602, "invalid_params", NULL, "no connection to attach");
        return;
    }
    bool write = conch_rpc_bool(params, "write", false);
    struct sclient *me = client_of(s, sink);
    if (!me) {
        me = calloc(1, sizeof(*me));
        if (!me) {
            conch_rpc_call_failf(call, -32603, "internal_error", NULL, "out of memory");
            return;
        }
        me->sink = conch_rpc_sink_ref(sink);
        conch_list_add(&s->clients, &me->link);
    }
    if (write) {
        struct conch_list *pos, *tmp;
        conch_list_for_each_safe(pos, tmp, &s->clients)
        {
            struct sclient *c = conch_list_entry(pos, struct sclient, link);
            if (c != me && c->writer) {
                c->writer = false;
                conch_daemon_client_notify(c->sink, "session.writer",
                                           json_pack("{s:s,s:b,s:s}", "session", s->id, "writer", 0,
                                                     "reason", "another client took over"));
            }
        }
        me->writer = true;
    }
    size_t len = 0;
    char *sbk = conch_daemon_session_ring_copy(s, &len);
    json_t *o = conch_daemon_session_json(s);
    json_object_set_new(o, "scrollback", conch_json_text(sbk ? sbk : "", sbk ? len : 0));
    json_object_set_new(o, "seq", json_integer((json_int_t)(s->seq - len)));
    json_object_set_new(o, "next_seq", json_integer((json_int_t)s->seq));
    json_object_set_new(o, "you_write", json_boolean(me->writer));
    free(sbk);
    conch_daemon_session_touch(s);
    conch_rpc_call_reply(call, o);
}

void conch_daemon_handle_session_detach(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    struct sclient *me = client_of(s, ctx_sink(ctx));
    if (me) {
        conch_list_del(&me->link);
        conch_rpc_sink_unref(me->sink);
        free(me);
    }
    conch_rpc_call_reply(call, json_pack("{s:b}", "detached", me != NULL));
}

void conch_daemon_handle_session_resize(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    (void)ctx;
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    s->rows = (unsigned short)conch_rpc_int(params, "rows", s->rows);
    s->cols = (unsigned short)conch_rpc_int(params, "cols", s->cols);
    conch_daemon_session_set_winsize(s);
    conch_rpc_call_reply(call, json_pack("{s:i,s:i}", "rows", s->rows, "cols", s->cols));
}

void conch_daemon_handle_session_signal(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    (void)ctx;
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    const char *name = conch_rpc_str(params, "signal", "INT");
    static const struct {
        const char *name;
        int sig;
    } sigs[] = {{"INT", SIGINT},   {"TERM", SIGTERM}, {"KILL", SIGKILL},
                {"HUP", SIGHUP},   {"QUIT", SIGQUIT}, {"TSTP", SIGTSTP},
                {"CONT", SIGCONT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}};
    int sig = 0;
    if (!strncmp(name, "SIG", 3))
        name += 3;
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        if (!strcmp(name, sigs[i].name))
            sig = sigs[i].sig;
    if (!sig) {
        conch_rpc_call_fail_param(call, "signal", "unknown signal '%s'", name);
        return;
    }
    if (s->state != SS_LIVE || s->master < 0 || conch_daemon_session_fg_signal(s, sig) < 0) {
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_STOPPED, "session_ended", NULL,
                             "session %s is not running", s->id);
        return;
    }
    conch_rpc_call_reply(call, json_pack("{s:i}", "signal", sig));
}

void conch_daemon_handle_session_list(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    const char *sb = conch_rpc_str(params, "sandbox", NULL);
    json_t *a = json_array();
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &sessions)
    {
        struct session *s = conch_list_entry(pos, struct session, link);
        if ((!sb || !strcmp(sb, s->sandbox_id)) && session_visible(c->d, s))
            json_array_append_new(a, conch_daemon_session_json(s));
    }
    conch_rpc_call_reply(call, json_pack("{s:o}", "sessions", a));
}

void conch_daemon_session_free(struct session *s)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &s->clients)
    {
        struct sclient *c = conch_list_entry(pos, struct sclient, link);
        conch_list_del(&c->link);
        conch_rpc_sink_unref(c->sink);
        free(c);
    }
    conch_daemon_session_timers_close(s);
    conch_daemon_session_uncharge(s);
    free(s->ring);
    free(s->cwd);
    json_decref(s->env);
    conch_bridge_report_done(&s->tools);
    free(s);
}

void conch_daemon_sessions_sandbox_gone(struct sandbox *sb)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &sessions)
    {
        struct session *s = conch_list_entry(pos, struct session, link);
        if (s->held_sb == sb)
            conch_daemon_session_uncharge(s);
    }
}

/* Forget @s: kill its shell (its end comes at once, synchronously or not), tell clients. */
static void session_destroy(struct session *s, const char *why)
{
    s->closing = true;
    conch_daemon_session_fail_queue(s, why);
    if (s->state != SS_ENDED)
        conch_daemon_session_end(s, why);
    session_unrecord(s);
    conch_list_del(&s->link);
    n_sessions--;
    /* The proc stays the supervisor's until its final event: shell_ended frees @s then. */
    if (s->proc_live)
        conch_super_signal(&s->proc, SIGKILL);
    else
        conch_daemon_session_free(s);
}

void conch_daemon_handle_session_close(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    (void)ctx;
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    session_destroy(s, "closed by a client");
    conch_rpc_call_reply(call, json_pack("{s:b}", "closed", 1));
}

/* Forget the oldest ended sessions past MAX_RECORDS (and their records). */
static void sessions_trim(struct daemon *d)
{
    (void)d;
    while (n_sessions > MAX_RECORDS) {
        struct session *old = NULL;
        struct conch_list *pos, *tmp;
        conch_list_for_each_safe(pos, tmp, &sessions)
        {
            struct session *s = conch_list_entry(pos, struct session, link);
            if (s->state == SS_ENDED && !s->cur && conch_list_empty(&s->queue) && !s->proc_live &&
                (!old || s->created_at < old->created_at))
                old = s;
        }
        if (!old)
            return;
        session_unrecord(old);
        conch_list_del(&old->link);
        n_sessions--;
        conch_daemon_session_free(old);
    }
}

void conch_daemon_sessions_recover(struct daemon *d)
{
    char dir[PATH_MAX];
    if (records_dir(d, dir, sizeof(dir)) < 0)
        return;
    DIR *dh = opendir(dir);
    if (!dh)
        return;
    struct dirent *e;
    while ((e = readdir(dh))) {
        size_t nl = strlen(e->d_name);
        if (e->d_name[0] == '.' || nl < 6 || nl > 40 || strcmp(e->d_name + nl - 5, ".json"))
            continue;
        char path[PATH_MAX + 64];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        size_t len = 0;
        char *text = read_record(path, 1 << 16, &len);
        json_t *o = text ? json_loadb(text, len, 0, NULL) : NULL;
        free(text);
        const char *id = json_string_value(json_object_get(o, "session"));
        const char *sb = json_string_value(json_object_get(o, "sandbox"));
        struct session *s =
            id && sb && !conch_daemon_session_find(id) ? calloc(1, sizeof(*s)) : NULL;
        if (!s) {
            json_decref(o);
            continue;
        }
        s->d = d;
        s->recovered = true;
        s->state = SS_ENDED;
        s->sock = s->master = -1;
        snprintf(s->id, sizeof(s->id), "%s", id);
        snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", sb);
        const char *why = json_string_value(json_object_get(o, "reason"));
        if (!strcmp(json_string_value(json_object_get(o, "state")) ?: "", "ended") && why)
            snprintf(s->end_reason, sizeof(s->end_reason), "%s", why);
        else
            snprintf(s->end_reason, sizeof(s->end_reason),
                     "the daemon stopped while it ran (listed from its record)");
        json_t *code = json_object_get(o, "exit_code");
        s->end_code = json_is_integer(code) ? (int)json_integer_value(code) : -1;
        s->rows = (unsigned short)json_integer_value(json_object_get(o, "rows"));
        s->cols = (unsigned short)json_integer_value(json_object_get(o, "cols"));
        s->created_at = json_real_value(json_object_get(o, "created_at"));
        s->last_used_at = json_real_value(json_object_get(o, "last_used_at"));
        json_decref(o);
        CONCH_LIST_INIT(&s->clients);
        CONCH_LIST_INIT(&s->queue);
        snprintf(path, sizeof(path), "%s/%s.out", dir, s->id);
        s->ring = read_record(path, 64u << 20, &len);
        s->ring_cap = s->ring_size = s->ring_len = s->ring ? len : 0;
        s->ring_pos = 0;
        s->seq = s->ring_len;
        s->cap.spill_fd = s->nocap.spill_fd = -1;
        if (conch_daemon_session_timers_open(s) < 0) {
            free(s->ring);
            free(s);
            continue;
        }
        conch_list_add(&sessions, &s->link);
        n_sessions++;
    }
    closedir(dh);
    sessions_trim(d);
}

size_t conch_daemon_sessions_live(const struct sandbox *sb, char *buf, size_t size)
{
    size_t n = 0, off = 0;
    if (size)
        buf[0] = '\0';
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &sessions)
    {
        struct session *s = conch_list_entry(pos, struct session, link);
        if (s->state == SS_ENDED || strcmp(s->sandbox_id, sb->id))
            continue;
        n++;
        int w = snprintf(buf + off, off < size ? size - off : 0, "%s%s", off ? ", " : "", s->id);
        if (w > 0 && off + (size_t)w < size)
            off += (size_t)w;
    }
    return n;
}
