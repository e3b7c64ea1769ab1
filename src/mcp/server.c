/* server.c - one MCP session over stdio: the JSON-RPC lines of the MCP client on one side,
 * the daemon child (`conch serve --stdio`) on the other, and the lifecycle of the session's
 * sandbox (created at initialize, committed if asked and destroyed at the end). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "mcp/mcp-internal.h"
#include "mcp/mcp.h"
#include "rpc/rpc.h"

#define MCP_LATEST "2025-06-18"
#define MAX_CLIENT_LINE (32u << 20)  /* tool arguments: a write_file of a large file */
#define DAEMON_MAX_MESSAGE "48M"     /* the child's --max-message: above MAX_CLIENT_LINE */
#define MAX_DAEMON_LINE (128u << 20) /* the daemon caps its answers at 64 MiB */
#define END_TIMEOUT_MS 120000        /* commit and destroy at the end of the session */

static const char *const supported_versions[] = {"2025-06-18", "2025-03-26", "2024-11-05"};

struct mcp {
    const struct conch_mcp_opts *o;
    int in_fd, out_fd;
    int child_in, child_out; /* the daemon's stdin (we write), stdout (we read) */
    pid_t child;
    bool child_gone;
    bool client_gone;
    char state_dir[4096];
    bool private_state;
    struct mcp_linebuf from_client, from_child;
    uint64_t next_id;
    struct mcp_call *pending;
    json_t *tools_list; /* the tools/list result */
    json_t *jobs;       /* job id -> [stdout offset, stderr offset] */
    char sandbox[128];  /* "" until sandbox.create answered */
    char shell[128];    /* the shell tool's session id; "" until opened */
    bool shell_opening; /* its session.open is in flight */
    char sandbox_err[512];
    const char *version; /* negotiated protocol version; NULL before initialize */
    bool creating;
};

/* ---- output to the MCP client ---- */

static void send_json(struct mcp *m, json_t *msg)
{
    if (m->client_gone) {
        json_decref(msg);
        return;
    }
    char *s = json_dumps(msg, JSON_COMPACT);
    json_decref(msg);
    if (!s)
        return;
    size_t n = strlen(s);
    char *line = realloc(s, n + 2);
    if (!line) {
        free(s);
        return;
    }
    line[n] = '\n';
    if (conch_write_all(m->out_fd, line, n + 1) < 0)
        m->client_gone = true;
    free(line);
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
    if (m->child_gone) {
        json_decref(params);
        return -EPIPE;
    }
    uint64_t id = ++m->next_id;
    size_t n = 0;
    char *line = conch_rpc_request_line(id, method, params, &n);
    json_decref(params);
    if (!line)
        return -ENOMEM;
    int r = conch_write_all(m->child_in, line, n);
    free(line);
    if (r < 0) {
        m->child_gone = true;
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
    s.name = "mcp";
    s.idle_timeout = 0;
    return conch_spec_to_json(&s);
}

static void handle_initialize(struct mcp *m, json_t *id, json_t *params)
{
    if (m->version || m->creating) {
        send_error(m, id, -32600, "the session is already initialized");
        return;
    }
    if (m->child_gone) {
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

static void on_client_message(void *ctx, const char *line, size_t len)
{
    struct mcp *m = ctx;
    json_error_t je;
    json_t *msg = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!msg) {
        send_error(m, NULL, -32700, "parse error: %s (at position %d)", je.text, je.position);
        return;
    }
    if (json_is_array(msg)) {
        send_error(m, NULL, -32600,
                   "batches are not part of MCP 2025-06-18: send one message "
                   "per line");
        json_decref(msg);
        return;
    }
    json_t *id = json_object_get(msg, "id");
    json_t *method = json_object_get(msg, "method");
    json_t *params = json_object_get(msg, "params");
    if (!json_is_object(msg) || !json_is_string(json_object_get(msg, "jsonrpc")) ||
        strcmp(json_string_value(json_object_get(msg, "jsonrpc")), "2.0")) {
        send_error(m, NULL, -32600, "not a JSON-RPC 2.0 message");
        json_decref(msg);
        return;
    }
    if (!method) { /* a response to a request of ours: we send none */
        json_decref(msg);
        return;
    }
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
    json_decref(msg);
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

static void client_too_large(void *ctx, struct mcp_linebuf *b)
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

/* ---- the daemon child ---- */

static int spawn_child(struct mcp *m, const sigset_t *old_mask, struct conch_err *err)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) < 0)
        return conch_err_set(err, errno, "pipe: %s", strerror(errno));
    if (pipe2(out, O_CLOEXEC) < 0) {
        int e = errno;
        close(in[0]);
        close(in[1]);
        return conch_err_set(err, e, "pipe: %s", strerror(e));
    }
    const char *exe = m->o->conch_exe ? m->o->conch_exe : "/proc/self/exe";
    char *const argv[] = {(char *)"conch",
                          (char *)"serve",
                          (char *)"--stdio",
                          (char *)"--state-dir",
                          m->state_dir,
                          (char *)"--pool",
                          (char *)"0",
                          (char *)"--idle-timeout",
                          (char *)"0",
                          (char *)"--max-message",
                          (char *)DAEMON_MAX_MESSAGE,
                          NULL};
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        return conch_err_set(err, e, "fork: %s", strerror(e));
    }
    if (pid == 0) {
        /* The daemon's stdin and stdout are our pipes, its stderr is ours (MCP clients log
         * it); it dies with us. */
        if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0)
            _exit(127);
        signal(SIGPIPE, SIG_DFL);
        sigprocmask(SIG_SETMASK, old_mask, NULL);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        execv(exe, argv);
        dprintf(2, "conch mcp: cannot run '%s serve --stdio': %s\n", exe, strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    m->child = pid;
    m->child_in = in[1];
    m->child_out = out[0];
    return 0;
}

/* Wait up to @ms for the child to exit; returns its status or -1. */
static int wait_child(struct mcp *m, int ms)
{
    for (int waited = 0;; waited += 10) {
        int st;
        pid_t r = waitpid(m->child, &st, WNOHANG);
        if (r == m->child)
            return st;
        if (r < 0 && errno != EINTR)
            return -1;
        if (waited >= ms)
            return -1;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
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
            char *nl = memchr(m->from_child.buf ? m->from_child.buf : "", '\n',
                              m->from_child.buf ? m->from_child.len : 0);
            if (!nl)
                break;
            size_t ll = (size_t)(nl - m->from_child.buf);
            json_t *msg = json_loadb(m->from_child.buf, ll, JSON_ALLOW_NUL, NULL);
            memmove(m->from_child.buf, nl + 1, m->from_child.len - ll - 1);
            m->from_child.len -= ll + 1;
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
        struct pollfd p = {.fd = m->child_out, .events = POLLIN};
        int r = poll(&p, 1, 1000);
        if (r < 0 && errno != EINTR)
            break;
        if (r == 0) {
            waited += 1000;
            continue;
        }
        if (r > 0) {
            r = conch_mcp_linebuf_fill(&m->from_child, m->child_out);
            if (r <= 0) {
                m->child_gone = true;
                conch_err_set(err, EPIPE, "%s: conch's daemon exited", method);
                return NULL;
            }
        }
    }
    conch_err_set(err, ETIMEDOUT, "%s: no answer from conch's daemon in %d s", method,
                  END_TIMEOUT_MS / 1000);
    return NULL;
}

static int end_session(struct mcp *m, struct conch_err *err)
{
    int ret = 0;
    if (m->sandbox[0] && !m->child_gone) {
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
    close(m->child_in);
    m->child_in = -1;
    if (wait_child(m, 10000) < 0) {
        kill(m->child, SIGKILL);
        wait_child(m, 5000);
    }
    if (m->private_state)
        conch_rm_path(m->state_dir, CONCH_RM_ONE_FS);
    return ret;
}

/* ---- the session ---- */

void conch_mcp_opts_init(struct conch_mcp_opts *o)
{
    memset(o, 0, sizeof(*o));
    conch_spec_defaults(&o->sandbox);
    o->timeout_ms = 120000;
    o->max_output = 64 * 1024;
}

static json_t *build_tools_list(struct conch_err *err)
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
static void remove_stale(const char *parent)
{
    DIR *d = opendir(parent);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, "mcp-", 4) || strlen(de->d_name) != 10)
            continue;
        char path[4200], db[4300];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", parent, de->d_name);
        if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
            time(NULL) - st.st_mtime < 60)
            continue;
        snprintf(db, sizeof(db), "%s/state.db", path);
        int fd = open(db, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0) {
            close(fd);
            continue;
        }
        conch_rm_path(path, CONCH_RM_ONE_FS);
        if (fd >= 0)
            close(fd);
    }
    closedir(d);
}

static int make_private_state(struct mcp *m, struct conch_err *err)
{
    int r = conch_mkdir_p(m->o->state_parent, 0700, err);
    if (r < 0)
        return conch_err_wrap(err, "state directory");
    remove_stale(m->o->state_parent);
    int n = snprintf(m->state_dir, sizeof(m->state_dir), "%s/mcp-XXXXXX", m->o->state_parent);
    if (n < 0 || (size_t)n >= sizeof(m->state_dir))
        return conch_err_set(err, ENAMETOOLONG, "state directory path too long");
    if (!mkdtemp(m->state_dir))
        return conch_err_set(err, errno, "make a state directory in '%s': %s", m->o->state_parent,
                             strerror(errno));
    m->private_state = true;
    return 0;
}

int conch_mcp_serve(const struct conch_mcp_opts *o, int in_fd, int out_fd, struct conch_err *err)
{
    struct mcp m = {.o = o, .in_fd = in_fd, .out_fd = out_fd, .child_in = -1, .child_out = -1};
    m.from_client.max = MAX_CLIENT_LINE;
    m.from_child.max = MAX_DAEMON_LINE;
    int r;
    m.tools_list = build_tools_list(err);
    if (!m.tools_list)
        return -err->code;
    m.jobs = json_object();
    if (o->state_dir) {
        snprintf(m.state_dir, sizeof(m.state_dir), "%s", o->state_dir);
    } else if (!o->state_parent) {
        r = conch_err_set(err, EINVAL, "no state directory given");
        goto out;
    } else if ((r = make_private_state(&m, err)) < 0) {
        goto out;
    }

    /* SIGTERM, SIGINT, SIGHUP end the session like EOF (an MCP client that does not close
     * stdin first, or a terminal that goes away). */
    sigset_t mask, old;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, &old);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    signal(SIGPIPE, SIG_IGN);
    if ((r = spawn_child(&m, &old, err)) < 0)
        goto out_sig;

    bool quit = false, in_eof = false;
    while (!quit && !m.client_gone) {
        struct pollfd p[3] = {{.fd = in_eof ? -1 : in_fd, .events = POLLIN},
                              {.fd = m.child_gone ? -1 : m.child_out, .events = POLLIN},
                              {.fd = sfd, .events = POLLIN}};
        if (poll(p, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            r = conch_err_set(err, errno, "poll: %s", strerror(errno));
            break;
        }
        if (p[2].revents) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof(si)) > 0)
                fprintf(stderr, "conch mcp: signal %u: ending the session\n", si.ssi_signo);
            quit = true;
        }
        if (p[1].revents) {
            int got = conch_mcp_linebuf_fill(&m.from_child, m.child_out);
            if (got > 0) {
                conch_mcp_linebuf_lines(&m.from_child, &m, on_daemon_message, daemon_too_large);
            } else if (got <= 0) {
                m.child_gone = true;
                fprintf(stderr, "conch mcp: conch's daemon exited; tools now fail\n");
                while (m.pending) {
                    struct mcp_call *c = m.pending;
                    if (c->tool == &init_tool) {
                        json_t *e = json_pack("{s:s}", "message", "conch's daemon exited");
                        init_reply(&m, c, NULL, e);
                        json_decref(e);
                    } else {
                        conch_mcp_call_donef(&m, c, true,
                                             "Error: the sandbox is gone (conch's "
                                             "daemon exited)");
                    }
                }
            }
        }
        if (p[0].revents && !quit) {
            int got = conch_mcp_linebuf_fill(&m.from_client, in_fd);
            if (got > 0) {
                conch_mcp_linebuf_lines(&m.from_client, &m, on_client_message, client_too_large);
            } else {
                in_eof = true;
                quit = true;
            }
        }
    }
    r = end_session(&m, err);
    while (m.pending) {
        struct mcp_call *c = m.pending;
        m.pending = c->next;
        call_free(c);
    }
    if (m.child_out >= 0)
        close(m.child_out);
out_sig:
    if (sfd >= 0)
        close(sfd);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (r < 0 && m.private_state && m.child == 0)
        rmdir(m.state_dir);
out:
    free(m.from_client.buf);
    free(m.from_child.buf);
    json_decref(m.tools_list);
    json_decref(m.jobs);
    return r;
}
