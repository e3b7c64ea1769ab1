/* session.c - one MCP session, whatever carries it: the MCP client's JSON-RPC messages on one
 * side (handed in by the transport, answered through its to_client hook), the daemon's
 * connection on the other, and the lifecycle of the session's sandbox (created at initialize,
 * committed if asked and destroyed at the end). server.c (stdio) and http.c (Streamable HTTP)
 * each own sessions of this kind. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "mcp/mcp-internal.h"
#include "mcp/mcp.h"
#include "rpc/rpc.h"

#define MCP_LATEST "2025-06-18"
#define MAX_DAEMON_LINE (128u << 20) /* the daemon caps its answers at 64 MiB */
#define END_TIMEOUT_MS 120000        /* commit and destroy at the end of the session */

static const char *const supported_versions[] = {"2025-06-18", "2025-03-26", "2024-11-05"};

struct mcp {
    const struct conch_mcp_opts *o;
    struct mcp_io io;
    int daemon_in, daemon_out; /* we write requests to the first, read answers from the second */
    bool daemon_gone;
    const json_t *tools_list; /* the tools/list result; borrowed */
    char state_dir[4096];
    struct mcp_linebuf from_daemon;
    uint64_t next_id;
    struct mcp_call *pending;
    json_t *jobs;       /* job id -> [stdout offset, stderr offset] */
    char sandbox[128];  /* "" until sandbox.create answered */
    char shell[128];    /* the shell tool's session id; "" until opened */
    bool shell_opening; /* its session.open is in flight */
    char sandbox_err[512];
    const char *version; /* negotiated protocol version; NULL before initialize */
    bool creating;
    bool ending;         /* conch_mcp_session_end_async was called */
    const char *sb_name; /* the sandbox's name ("mcp"; NULL: none) */
    double sb_idle;      /* its idle_timeout (0: never) */
};

/* ---- output to the MCP client ---- */

static void send_json(struct mcp *m, json_t *msg)
{
    if (!msg)
        return;
    m->io.to_client(m->io.ctx, msg);
}

static void send_result(struct mcp *m, json_t *id, json_t *result)
{
    send_json(m, json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id, "result", result));
}

static void send_error(struct mcp *m, json_t *id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void send_error(struct mcp *m, json_t *id, int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    json_t *e = json_pack("{s:i,s:s%}", "code", code, "message", msg, strlen(msg));
    if (!e) /* the message is not UTF-8 (it quotes client data): say less */
        e = json_pack("{s:i,s:s}", "code", code, "message", "invalid request");
    send_json(
        m, json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id ? id : json_null(), "error", e));
}

/* ---- text helpers ---- */

/* ---- tool calls ---- */

const char *conch_mcp_sandbox_id(const struct mcp *m)
{
    return m->sandbox;
}

void conch_mcp_set_sandbox(struct mcp *m, const char *id)
{
    snprintf(m->sandbox, sizeof(m->sandbox), "%s", id);
}

const char *conch_mcp_state_dir(const struct mcp *m)
{
    return m->state_dir;
}

size_t conch_mcp_max_output(const struct mcp *m)
{
    return m->o->max_output;
}

uint64_t conch_mcp_default_timeout_ms(const struct mcp *m)
{
    return m->o->timeout_ms;
}

json_t *conch_mcp_job_offsets(struct mcp *m)
{
    return m->jobs;
}

const char *conch_mcp_shell_session(const struct mcp *m)
{
    return m->shell;
}

void conch_mcp_shell_set_session(struct mcp *m, const char *id)
{
    snprintf(m->shell, sizeof(m->shell), "%s", id ? id : "");
}

bool *conch_mcp_shell_opening(struct mcp *m)
{
    return &m->shell_opening;
}

static void call_free(struct mcp_call *c)
{
    if (!c)
        return;
    json_decref(c->id);
    json_decref(c->args);
    free(c);
}

static void unlink_pending(struct mcp *m, struct mcp_call *c)
{
    for (struct mcp_call **p = &m->pending; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            c->next = NULL;
            return;
        }
}

void conch_mcp_call_free(struct mcp *m, struct mcp_call *c)
{
    unlink_pending(m, c);
    call_free(c);
}

void conch_mcp_call_park(struct mcp *m, struct mcp_call *c)
{
    unlink_pending(m, c);
    c->daemon_id = 0; /* no daemon answer matches it */
    c->parked = true;
    c->next = m->pending;
    m->pending = c;
}

struct mcp_call *conch_mcp_call_unpark(struct mcp *m, const struct mcp_tool *tool)
{
    struct mcp_call *oldest = NULL; /* the list is newest first */
    for (struct mcp_call *c = m->pending; c; c = c->next)
        if (c->parked && c->tool == tool)
            oldest = c;
    if (oldest) {
        unlink_pending(m, oldest);
        oldest->parked = false;
    }
    return oldest;
}

void conch_mcp_call_done(struct mcp *m, struct mcp_call *c, bool is_error, const char *text,
                         size_t len)
{
    unlink_pending(m, c);
    size_t cl = 0;
    _cleanup_free_ char *capped = conch_mcp_cap_text(text, len, m->o->max_output, &cl);
    json_t *t = capped ? json_stringn(capped, cl) : NULL;
    if (!t) /* cut text that is not UTF-8 cannot come from the daemon's JSON: say so */
        t = json_string("conch mcp: the result could not be encoded as text");
    json_t *res =
        json_pack("{s:[{s:s,s:o}],s:b}", "content", "type", "text", "text", t, "isError", is_error);
    send_result(m, c->id, res);
    call_free(c);
}

void conch_mcp_call_donef(struct mcp *m, struct mcp_call *c, bool is_error, const char *fmt, ...)
{
    char *s = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) {
        conch_mcp_call_done(m, c, true, "out of memory", 13);
        return;
    }
    conch_mcp_call_done(m, c, is_error, s, (size_t)n);
    free(s);
}

void conch_mcp_call_fail_daemon(struct mcp *m, struct mcp_call *c, json_t *error)
{
    const char *msg = json_string_value(json_object_get(error, "message"));
    const char *code = json_string_value(json_object_get(json_object_get(error, "data"), "code"));
    conch_mcp_call_donef(m, c, true, "Error%s%s%s: %s", code ? " (" : "", code ? code : "",
                         code ? ")" : "", msg ? msg : "unknown error");
}

/* Send one request to the daemon; steals @params. Returns 0 with its id, or -errno. */
static int daemon_send(struct mcp *m, const char *method, json_t *params, uint64_t *ret_id)
{
    if (!params)
        return -ENOMEM;
    if (m->daemon_gone) {
        json_decref(params);
        return -EPIPE;
    }
    uint64_t id = ++m->next_id;
    size_t n = 0;
    char *line = conch_rpc_request_line(id, method, params, &n);
    json_decref(params);
    if (!line)
        return -ENOMEM;
    int r = conch_write_all(m->daemon_in, line, n);
    free(line);
    if (r < 0) {
        m->daemon_gone = true;
        return r;
    }
    *ret_id = id;
    return 0;
}

void conch_mcp_daemon_call(struct mcp *m, struct mcp_call *c, const char *method, json_t *params)
{
    /* Every method but those that name a job or a session works on the session's sandbox. */
    bool by_job = !strcmp(method, "job.output") || !strcmp(method, "job.wait") ||
                  !strcmp(method, "job.kill") ||
                  (!strncmp(method, "session.", 8) && strcmp(method, "session.open"));
    /* A fork of a snapshot names the session's sandbox too: the daemon then forks only a
     * snapshot of that sandbox's (not another session's, with its workspace and rules). */
    if (params && m->sandbox[0] && !by_job && !json_object_get(params, "sandbox"))
        json_object_set_new(params, "sandbox", json_string(m->sandbox));
    uint64_t id = 0;
    int r = daemon_send(m, method, params, &id);
    if (r < 0) {
        if (r == -ENOMEM)
            conch_mcp_call_done(m, c, true, "out of memory", 13);
        else
            conch_mcp_call_donef(m, c, true, "Error: the sandbox is gone (conch's daemon exited)");
        return;
    }
    c->daemon_id = id;
    unlink_pending(m, c);
    c->next = m->pending;
    m->pending = c;
}

/* ---- initialize: the session's sandbox ---- */

static void init_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error);
static void end_call(struct mcp *m, const char *method, json_t *params);
static const struct mcp_tool init_tool = {.name = "(initialize)", .reply = init_reply};

static json_t *instructions(struct mcp *m)
{
    const struct conch_mcp_opts *o = m->o;
    const char *mode = conch_ws_mode_name(o->sandbox.mode);
    char ws[4600];
    if (!o->sandbox.workspace)
        snprintf(ws, sizeof(ws), "/workspace is an empty scratch directory.");
    else if (!strcmp(mode, "overlay"))
        snprintf(ws, sizeof(ws),
                 "/workspace is a copy-on-write view of the project: changes stay in the "
                 "sandbox until the `commit` tool applies them (`changes` and `diff` show "
                 "them)%s. `snapshot` saves a checkpoint to `restore` or `fork` from.",
                 o->commit_on_exit ? "; they are also committed when the session ends" : "");
    else if (!strcmp(mode, "ro"))
        snprintf(ws, sizeof(ws), "/workspace is the project, read-only.");
    else
        snprintf(ws, sizeof(ws), "/workspace is the project itself: writes are live.");
    char buf[5200];
    snprintf(buf, sizeof(buf),
             "Every tool runs inside a conch sandbox: a Linux machine with its own filesystem, "
             "no network, running as user `agent`. %s Relative paths are under /workspace; "
             "/tmp and /home/agent are writable scratch space.",
             ws);
    return json_string(buf);
}

static void init_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    unlink_pending(m, c);
    m->creating = false;
    const char *id = json_string_value(json_object_get(res, "id"));
    if (error || !id) {
        const char *msg = json_string_value(json_object_get(error, "message"));
        snprintf(m->sandbox_err, sizeof(m->sandbox_err), "%s",
                 msg ? msg : "no sandbox id in the daemon's answer");
        fprintf(stderr, "conch mcp: cannot create the sandbox: %s\n", m->sandbox_err);
        send_error(m, c->id, -32603, "conch mcp: cannot create the sandbox: %s", m->sandbox_err);
        m->version = NULL;
        call_free(c);
        return;
    }
    snprintf(m->sandbox, sizeof(m->sandbox), "%s", id);
    if (m->ending) { /* the session ended while its sandbox was being made */
        end_call(m, "sandbox.destroy", json_pack("{s:s}", "id", m->sandbox));
        call_free(c);
        return;
    }
    json_t *r =
        json_pack("{s:s,s:{s:{s:b}},s:{s:s,s:s,s:s},s:o}", "protocolVersion", m->version,
                  "capabilities", "tools", "listChanged", 0, "serverInfo", "name", "conch", "title",
                  "conch sandbox", "version", "0.1.0", "instructions", instructions(m));
    send_result(m, c->id, r);
    call_free(c);
}

static json_t *sandbox_spec(struct mcp *m)
{
    struct conch_sandbox_spec s = m->o->sandbox;
    s.name = m->sb_name;
    s.idle_timeout = m->sb_idle;
    return conch_spec_to_json(&s);
}

static void handle_initialize(struct mcp *m, json_t *id, json_t *params)
{
    if (m->version || m->creating) {
        send_error(m, id, -32600, "the session is already initialized");
        return;
    }
    if (m->daemon_gone) {
        send_error(m, id, -32603, "conch mcp: conch's daemon exited (see its stderr)");
        return;
    }
    const char *v = json_string_value(json_object_get(params, "protocolVersion"));
    if (!v) {
        send_error(m, id, -32602, "initialize: params.protocolVersion (a string) is required");
        return;
    }
    /* Version negotiation: the client's when we speak it, else our latest. */
    m->version = MCP_LATEST;
    for (size_t i = 0; i < sizeof(supported_versions) / sizeof(*supported_versions); i++)
        if (!strcmp(v, supported_versions[i]))
            m->version = supported_versions[i];
    if (m->sandbox[0]) { /* initialized once, then re-initialized after a failure: no */
        send_error(m, id, -32600, "the session is already initialized");
        return;
    }
    struct mcp_call *c = calloc(1, sizeof(*c));
    if (!c) {
        send_error(m, id, -32603, "out of memory");
        return;
    }
    c->tool = &init_tool;
    c->id = json_incref(id);
    uint64_t did = 0;
    if (daemon_send(m, "sandbox.create", sandbox_spec(m), &did) < 0) {
        send_error(m, id, -32603, "conch mcp: cannot reach conch's daemon");
        m->version = NULL;
        call_free(c);
        return;
    }
    m->creating = true;
    c->daemon_id = did;
    c->next = m->pending;
    m->pending = c;
}

/* ---- the MCP client's messages ---- */

/* Every tool, table by table. */
static const struct mcp_tool *const tool_tables[] = {conch_mcp_tools, conch_mcp_snapshot_tools};
#define N_TOOL_TABLES (sizeof(tool_tables) / sizeof(tool_tables[0]))

static const struct mcp_tool *find_tool(const char *name)
{
    for (size_t i = 0; i < N_TOOL_TABLES; i++)
        for (const struct mcp_tool *t = tool_tables[i]; t->name; t++)
            if (!strcmp(t->name, name))
                return t;
    return NULL;
}

static void handle_tools_call(struct mcp *m, json_t *id, json_t *params)
{
    const char *name = json_string_value(json_object_get(params, "name"));
    json_t *args = json_object_get(params, "arguments");
    if (!name) {
        send_error(m, id, -32602, "tools/call: params.name (a string) is required");
        return;
    }
    const struct mcp_tool *t = find_tool(name);
    if (!t) {
        send_error(m, id, -32602, "unknown tool '%s' (tools/list lists them)", name);
        return;
    }
    if (args && !json_is_object(args) && !json_is_null(args)) {
        send_error(m, id, -32602, "tools/call: params.arguments must be an object");
        return;
    }
    struct mcp_call *c = calloc(1, sizeof(*c));
    if (!c) {
        send_error(m, id, -32603, "out of memory");
        return;
    }
    c->tool = t;
    c->id = json_incref(id);
    c->args = json_is_object(args) ? json_incref(args) : json_object();
    if (!m->sandbox[0]) {
        conch_mcp_call_donef(m, c, true, "Error: no sandbox: %s",
                             m->sandbox_err[0] ? m->sandbox_err : "the session is not initialized");
        return;
    }
    t->start(m, c);
}

static void handle_request(struct mcp *m, const char *method, json_t *id, json_t *params)
{
    if (!strcmp(method, "initialize")) {
        handle_initialize(m, id, params);
    } else if (!strcmp(method, "ping")) {
        send_result(m, id, json_object());
    } else if (!strcmp(method, "tools/list")) {
        if (!m->sandbox[0] && !m->version)
            send_error(m, id, -32600, "the session is not initialized: send initialize first");
        else
            send_result(m, id, json_deep_copy(m->tools_list));
    } else if (!strcmp(method, "tools/call")) {
        if (!m->version)
            send_error(m, id, -32600, "the session is not initialized: send initialize first");
        else
            handle_tools_call(m, id, params);
    } else {
        send_error(m, id, -32601, "method '%s' not found (conch mcp offers tools only)", method);
    }
}

void conch_mcp_session_message(struct mcp *m, json_t *msg)
{
    if (json_is_array(msg)) {
        send_error(m, NULL, -32600,
                   "batches are not part of MCP 2025-06-18: send one message at a time");
        return;
    }
    json_t *id = json_object_get(msg, "id");
    json_t *method = json_object_get(msg, "method");
    json_t *params = json_object_get(msg, "params");
    if (!json_is_object(msg) || !json_is_string(json_object_get(msg, "jsonrpc")) ||
        strcmp(json_string_value(json_object_get(msg, "jsonrpc")), "2.0")) {
        send_error(m, NULL, -32600, "not a JSON-RPC 2.0 message");
        return;
    }
    if (!method) /* a response to a request of ours: we send none */
        return;
    bool valid_id = json_is_string(id) || json_is_integer(id);
    if (!json_is_string(method) || (id && !valid_id)) {
        send_error(m, valid_id ? id : NULL, -32600,
                   "invalid request: 'method' must be a string and 'id' a string or an integer");
    } else if (params && !json_is_object(params) && !json_is_null(params)) {
        if (id)
            send_error(m, id, -32602, "params must be an object");
    } else if (!id) {
        /* Notifications: initialized, cancelled (a call still runs to its end; its answer
         * is then ignored by the client), progress... nothing to do. */
    } else {
        handle_request(m, json_string_value(method), id, json_is_object(params) ? params : NULL);
    }
}

void conch_mcp_session_line(void *ctx, const char *line, size_t len)
{
    struct mcp *m = ctx;
    json_error_t je;
    json_t *msg = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!msg) {
        send_error(m, NULL, -32700, "parse error: %s (at position %d)", je.text, je.position);
        return;
    }
    conch_mcp_session_message(m, msg);
    json_decref(msg);
}

void conch_mcp_session_send_error(struct mcp *m, json_t *id, int code, const char *msg)
{
    send_error(m, id, code, "%s", msg);
}

/* ---- the daemon's messages ---- */

static void on_daemon_message(void *ctx, const char *line, size_t len)
{
    struct mcp *m = ctx;
    json_t *msg = json_loadb(line, len, JSON_ALLOW_NUL, NULL);
    json_t *id = json_object_get(msg, "id");
    if (!json_is_integer(id)) { /* a notification (exec.output, job.exited) */
        json_decref(msg);
        return;
    }
    uint64_t n = (uint64_t)json_integer_value(id);
    struct mcp_call *c = m->pending;
    while (c && c->daemon_id != n)
        c = c->next;
    if (c) {
        c->daemon_id = 0;
        json_t *err = json_object_get(msg, "error");
        c->tool->reply(m, c, err ? NULL : json_object_get(msg, "result"), err);
    }
    json_decref(msg);
}

/* ---- lines ---- */

void conch_mcp_session_too_large(void *ctx, struct mcp_linebuf *b)
{
    struct mcp *m = ctx;
    json_t *id = conch_mcp_sniff_id(b);
    send_error(m, id, -32600, "message too large: more than %zu bytes in one line", b->max);
    json_decref(id);
}

static void daemon_too_large(void *ctx, struct mcp_linebuf *b)
{
    (void)ctx;
    fprintf(stderr, "conch mcp: dropped an answer of the daemon longer than %zu bytes\n", b->max);
}

/* ---- the daemon connection ---- */

void conch_mcp_session_daemon_lost(struct mcp *m)
{
    m->daemon_gone = true;
    while (m->pending) {
        struct mcp_call *c = m->pending;
        if (c->tool == &init_tool) {
            json_t *e = json_pack("{s:s}", "message", "conch's daemon exited");
            init_reply(m, c, NULL, e);
            json_decref(e);
        } else if (!c->tool->start) { /* internal: no MCP request to answer */
            json_t *e = json_pack("{s:i,s:s}", "code", -32603, "message", "conch's daemon is gone");
            c->tool->reply(m, c, NULL, e);
            json_decref(e);
        } else {
            conch_mcp_call_donef(m, c, true, "Error: the sandbox is gone (conch's daemon exited)");
        }
    }
}

int conch_mcp_session_daemon_input(struct mcp *m)
{
    int got = conch_mcp_linebuf_fill(&m->from_daemon, m->daemon_out);
    if (got > 0) {
        conch_mcp_linebuf_lines(&m->from_daemon, m, on_daemon_message, daemon_too_large);
        return 1;
    }
    conch_mcp_session_daemon_lost(m);
    return 0;
}

/* A request at the end of the session: the client is gone, so wait for this one answer
 * only. Returns the result (new reference) or NULL with @err filled. */
static json_t *call_sync(struct mcp *m, const char *method, json_t *params, struct conch_err *err)
{
    uint64_t want = 0;
    if (daemon_send(m, method, params, &want) < 0) {
        conch_err_set(err, EPIPE, "%s: conch's daemon is gone", method);
        return NULL;
    }
    int waited = 0;
    while (waited < END_TIMEOUT_MS) {
        /* Complete lines already read first. */
        for (;;) {
            char *nl = memchr(m->from_daemon.buf ? m->from_daemon.buf : "", '\n',
                              m->from_daemon.buf ? m->from_daemon.len : 0);
            if (!nl)
                break;
            size_t ll = (size_t)(nl - m->from_daemon.buf);
            json_t *msg = json_loadb(m->from_daemon.buf, ll, JSON_ALLOW_NUL, NULL);
            memmove(m->from_daemon.buf, nl + 1, m->from_daemon.len - ll - 1);
            m->from_daemon.len -= ll + 1;
            json_t *id = json_object_get(msg, "id");
            if (json_is_integer(id) && (uint64_t)json_integer_value(id) == want) {
                json_t *e = json_object_get(msg, "error");
                if (e) {
                    const char *s = json_string_value(json_object_get(e, "message"));
                    conch_err_set(err, EIO, "%s: %s", method, s ? s : "failed");
                    json_decref(msg);
                    return NULL;
                }
                json_t *res = json_incref(json_object_get(msg, "result"));
                json_decref(msg);
                return res;
            }
            json_decref(msg);
        }
        struct pollfd p = {.fd = m->daemon_out, .events = POLLIN};
        int r = poll(&p, 1, 1000);
        if (r < 0 && errno != EINTR)
            break;
        if (r == 0) {
            waited += 1000;
            continue;
        }
        if (r > 0) {
            r = conch_mcp_linebuf_fill(&m->from_daemon, m->daemon_out);
            if (r <= 0) {
                m->daemon_gone = true;
                conch_err_set(err, EPIPE, "%s: conch's daemon exited", method);
                return NULL;
            }
        }
    }
    conch_err_set(err, ETIMEDOUT, "%s: no answer from conch's daemon in %d s", method,
                  END_TIMEOUT_MS / 1000);
    return NULL;
}

int conch_mcp_session_end(struct mcp *m, struct conch_err *err)
{
    int ret = 0;
    if (m->sandbox[0] && !m->daemon_gone) {
        if (m->shell[0]) { /* the shell tool's session: its shell goes, its record too */
            struct conch_err serr = {0};
            json_t *res =
                call_sync(m, "session.close", json_pack("{s:s}", "session", m->shell), &serr);
            if (!res)
                fprintf(stderr, "conch mcp: closing the shell session: %s\n", serr.msg);
            json_decref(res);
        }
        if (m->o->commit_on_exit) {
            json_t *res =
                call_sync(m, "workspace.commit", json_pack("{s:s}", "sandbox", m->sandbox), err);
            if (!res) {
                fprintf(stderr, "conch mcp: changes NOT committed: %s\n", err->msg);
                ret = -err->code;
            } else {
                size_t n = json_array_size(json_object_get(res, "committed"));
                fprintf(stderr, "conch mcp: committed %zu change%s to %s\n", n, n == 1 ? "" : "s",
                        m->o->sandbox.workspace ? m->o->sandbox.workspace : "the workspace");
                json_decref(res);
            }
        }
        struct conch_err derr = {0};
        json_t *res = call_sync(m, "sandbox.destroy", json_pack("{s:s}", "id", m->sandbox), &derr);
        if (!res)
            fprintf(stderr, "conch mcp: destroying the sandbox: %s\n", derr.msg);
        json_decref(res);
    }
    return ret;
}

/* ---- the session ---- */

json_t *conch_mcp_tools_list(struct conch_err *err)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < N_TOOL_TABLES; i++) {
        for (const struct mcp_tool *t = tool_tables[i]; t->name; t++) {
            json_error_t je;
            json_t *schema = json_loads(t->schema, 0, &je);
            if (!schema) {
                json_decref(arr);
                conch_err_set(err, EINVAL, "tool '%s': bad input schema: %s", t->name, je.text);
                return NULL;
            }
            json_array_append_new(
                arr, json_pack("{s:s,s:s,s:s,s:o,s:{s:b,s:b,s:b}}", "name", t->name, "title",
                               t->title, "description", t->description, "inputSchema", schema,
                               "annotations", "readOnlyHint", t->read_only, "destructiveHint",
                               t->destructive, "openWorldHint", 0));
        }
    }
    return json_pack("{s:o}", "tools", arr);
}

/* Remove the private state dirs of sessions that ended without cleaning up (conch mcp killed
 * with SIGKILL): their daemon is gone, so nothing holds the flock on their state.db, and they
 * are older than a minute (a starting session's daemon may not have claimed its database). */

/* ---- the end of a session that must not block (http.c) ---- */

static void end_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    (void)res;
    if (error) {
        const char *msg = json_string_value(json_object_get(error, "message"));
        fprintf(stderr, "conch mcp: ending session (sandbox %s): %s\n", m->sandbox,
                msg ? msg : "failed");
    }
    unlink_pending(m, c);
    call_free(c);
}
static const struct mcp_tool end_tool = {.name = "(end)", .reply = end_reply};

/* Send @method for the end of the session; its answer is only logged when an error. */
static void end_call(struct mcp *m, const char *method, json_t *params)
{
    struct mcp_call *c = calloc(1, sizeof(*c));
    if (!c) {
        json_decref(params);
        return;
    }
    c->tool = &end_tool;
    uint64_t id = 0;
    if (daemon_send(m, method, params, &id) < 0) {
        call_free(c);
        return;
    }
    c->daemon_id = id;
    c->next = m->pending;
    m->pending = c;
}

void conch_mcp_session_end_async(struct mcp *m)
{
    if (m->ending)
        return;
    m->ending = true;
    /* The MCP client is gone: answers to calls in flight go to nobody (the transport drops
     * them). A sandbox.create in flight destroys its sandbox when answered (init_reply). */
    if (!m->sandbox[0] || m->daemon_gone)
        return;
    if (m->shell[0])
        end_call(m, "session.close", json_pack("{s:s}", "session", m->shell));
    end_call(m, "sandbox.destroy", json_pack("{s:s}", "id", m->sandbox));
}

bool conch_mcp_session_done(const struct mcp *m)
{
    if (m->daemon_gone)
        return true;
    for (const struct mcp_call *c = m->pending; c; c = c->next)
        if (c->tool == &end_tool || c->tool == &init_tool)
            return false;
    return true;
}

void *conch_mcp_session_ctx(const struct mcp *m)
{
    return m->io.ctx;
}

struct mcp *conch_mcp_session_new(const struct conch_mcp_opts *o, const json_t *tools_list,
                                  const struct mcp_io *io, int daemon_in, int daemon_out,
                                  const char *state_dir)
{
    struct mcp *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->jobs = json_object();
    if (!m->jobs) {
        free(m);
        return NULL;
    }
    m->o = o;
    m->io = *io;
    m->tools_list = tools_list;
    m->daemon_in = daemon_in;
    m->daemon_out = daemon_out;
    m->from_daemon.max = MAX_DAEMON_LINE;
    m->sb_name = "mcp";
    snprintf(m->state_dir, sizeof(m->state_dir), "%s", state_dir ? state_dir : "");
    return m;
}

void conch_mcp_session_sandbox_opts(struct mcp *m, const char *name, double idle_timeout)
{
    m->sb_name = name;
    m->sb_idle = idle_timeout;
}

void conch_mcp_session_free(struct mcp *m)
{
    if (!m)
        return;
    while (m->pending) {
        struct mcp_call *c = m->pending;
        m->pending = c->next;
        call_free(c);
    }
    free(m->from_daemon.buf);
    json_decref(m->jobs);
    free(m);
}
