/* client.c - `conch ps`, `conch start` and `conch rm`: small blocking JSON-RPC clients of a
 * running `conch serve`. */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/opts.h"
#include "core/cleanup.h"
#include "core/fsutil.h"
#include "daemon/daemon.h"
#include "rpc/rpc.h"
#include "workspace/workspace.h"

/* Why the daemon at @path cannot be reached (@e, an errno), and what to do about it: only a
 * daemon that is not there is started with 'conch serve'. */
static int unreachable(struct conch_err *err, const char *path, int e)
{
    if (e == EACCES || e == EPERM)
        return conch_err_set(err, e,
                             "cannot reach the daemon at '%s': permission denied (the socket "
                             "or its directory belongs to another user: run as the user who "
                             "started the daemon, or as root)",
                             path);
    return conch_err_set(err, e,
                         "cannot reach the daemon at '%s': %s (start it with 'conch serve')", path,
                         strerror(e));
}

int conch_cli_connect(const char *path, struct conch_err *err)
{
    char def[PATH_MAX];
    if (!path) {
        conch_daemon_socket(def, sizeof(def));
        path = def;
    }
    int r = conch_daemon_socket_check(path, true, err);
    if (r == -EACCES)
        return unreachable(err, path, EACCES);
    if (r < 0)
        return r;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return conch_err_set(err, ENAMETOOLONG, "socket path too long: '%s'", path);
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return unreachable(err, path, e);
    }
    return fd;
}

int conch_cli_conn_open(struct conch_cli_conn *c, const char *path)
{
    memset(c, 0, sizeof(*c));
    struct conch_err err = {0};
    c->remote = conch_cli_remote_url() != NULL;
    c->fd = c->remote ? conch_cli_remote_connect(&err) : conch_cli_connect(path, &err);
    if (c->fd < 0) {
        fprintf(stderr, "conch: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int conch_cli_conn_send(struct conch_cli_conn *c, const char *method, json_t *params, int *ret_id)
{
    if (!params) { /* json_pack refused an argument: not UTF-8 (or out of memory) */
        errno = EILSEQ;
        return -1;
    }
    int id = ++c->next_id;
    size_t n = 0;
    _cleanup_free_ char *line = conch_rpc_request_line((uint64_t)id, method, params, &n);
    json_decref(params);
    if (!line) {
        errno = ENOMEM;
        return -1;
    }
    int r = conch_send_all(c->fd, line, n);
    if (r < 0) {
        errno = -r;
        return -1;
    }
    if (ret_id)
        *ret_id = id;
    return 0;
}

bool conch_cli_conn_fill(struct conch_cli_conn *c)
{
    return conch_rpc_reader_fill(&c->in, c->fd, NULL) > 0;
}

json_t *conch_cli_conn_next(struct conch_cli_conn *c, bool block)
{
    for (;;) {
        json_t *msg;
        struct conch_err err = {0};
        int r = conch_rpc_reader_next(&c->in, &msg, &err);
        if (r > 0)
            return msg;
        if (r < 0) {
            fprintf(stderr, "conch: %s\n", err.msg);
            continue;
        }
        if (!block || !conch_cli_conn_fill(c))
            return NULL;
    }
}

/* Protocol methods the daemon's messages name, and the verbs a person at the command line
 * uses for them (longest first: a name inside a longer one is replaced once). */
static const struct {
    const char *method, *verb;
} method_verbs[] = {
    {"workspace.* and sandbox.destroy work on it",
     "'conch changes', 'diff', 'commit', 'discard' and 'rm' work on it ('conch start' brings it "
     "back)"},
    {"session.attach {write: true}", "'conch attach'"},
    {"workspace.discard", "'conch discard'"},
    {"workspace.commit", "'conch commit'"},
    {"workspace.*", "'conch changes', 'diff', 'commit' and 'discard'"},
    {"sandbox.destroy", "'conch rm'"},
    {"sandbox.create", "'conch create'"},
    {"sandbox.list", "'conch ps'"},
    {"session.list", "'conch sessions'"},
    {"session.signal", "Ctrl-C in 'conch attach'"},
    {"session.open", "'conch shell'"},
    {"fs.delete", "'conch exec ID -- rm'"},
};

char *conch_cli_error_text(const char *msg)
{
    size_t cap = strlen(msg) * 4 + 512, len = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    const char *start = msg;
    while (*msg) {
        size_t k = sizeof(method_verbs) / sizeof(method_verbs[0]);
        /* whole words only: "fs.deleted" is not fs.delete */
        if (msg == start || !(isalnum((unsigned char)msg[-1]) || msg[-1] == '_'))
            for (k = 0; k < sizeof(method_verbs) / sizeof(method_verbs[0]); k++) {
                size_t ml = strlen(method_verbs[k].method);
                /* msg[ml] only once the first ml bytes matched: msg may be shorter */
                if (!strncmp(msg, method_verbs[k].method, ml) &&
                    !(isalnum((unsigned char)msg[ml]) || msg[ml] == '_'))
                    break;
            }
        if (k < sizeof(method_verbs) / sizeof(method_verbs[0])) {
            size_t n = strlen(method_verbs[k].verb);
            if (len + n + 1 > cap)
                break;
            memcpy(out + len, method_verbs[k].verb, n);
            len += n;
            msg += strlen(method_verbs[k].method);
        } else if (len + 2 <= cap) {
            out[len++] = *msg++;
        } else {
            break;
        }
    }
    out[len] = '\0';
    return out;
}

json_t *conch_cli_conn_call(struct conch_cli_conn *c, const char *method, json_t *params)
{
    int id;
    if (conch_cli_conn_send(c, method, params, &id) < 0) {
        fprintf(stderr, "conch: write to the daemon: %s\n", strerror(errno));
        return NULL;
    }
    for (;;) {
        json_t *msg = conch_cli_conn_next(c, true);
        if (!msg) {
            fprintf(stderr, "conch: the daemon closed the connection\n");
            return NULL;
        }
        json_t *jid = json_object_get(msg, "id");
        if (!json_is_integer(jid) || json_integer_value(jid) != id) {
            json_decref(msg); /* a notification, or an answer to a request not waited for */
            continue;
        }
        json_t *res = json_object_get(msg, "result");
        if (res) {
            json_incref(res);
            json_decref(msg);
            return res;
        }
        json_t *e = json_object_get(msg, "error");
        const char *code = json_string_value(json_object_get(json_object_get(e, "data"), "code"));
        const char *m = json_string_value(json_object_get(e, "message"));
        _cleanup_free_ char *text = conch_cli_error_text(m ? m : "unknown");
        fprintf(stderr, "conch: error%s%s%s: %s\n", code ? " (" : "", code ? code : "",
                code ? ")" : "",
                text ? text
                : m  ? m
                     : "unknown");
        json_decref(msg);
        return NULL;
    }
}

void conch_cli_conn_close(struct conch_cli_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    conch_rpc_reader_done(&c->in);
}

int conch_cli_resolve(struct conch_cli_conn *c, const char *ref, char *ret, size_t size)
{
    json_t *res = conch_cli_conn_call(c, "sandbox.list", json_object());
    if (!res)
        return -1;
    const char *found = NULL;
    unsigned named = 0;
    size_t i;
    json_t *sb;
    json_array_foreach(json_object_get(res, "sandboxes"), i, sb)
    {
        const char *id = json_string_value(json_object_get(sb, "id"));
        const char *name = json_string_value(json_object_get(sb, "name"));
        if (id && !strcmp(id, ref)) {
            found = id;
            named = 1;
            break;
        }
        if (name && !strcmp(name, ref)) {
            found = id;
            named++;
        }
    }
    int r = -1;
    if (!found)
        fprintf(stderr, "conch: no sandbox with id or name '%s' (see 'conch ps')\n", ref);
    else if (named > 1)
        fprintf(stderr, "conch: %u sandboxes are named '%s': give the id (see 'conch ps')\n", named,
                ref);
    else if ((size_t)snprintf(ret, size, "%s", found) < size)
        r = 0;
    json_decref(res);
    return r;
}

/* The options of ps and rm: --socket PATH, --json. */
struct client_opts {
    const char *sock;
    bool json;
};

enum { OPT_SOCKET = 1, OPT_JSON };

static int client_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct client_opts *o = ctx;
    if (key == OPT_SOCKET)
        o->sock = value;
    else
        o->json = true;
    return 0;
}

/* Parse them; returns the index of the first operand, or -1 after printing the help
 * (*@ret_status 0) or a usage error (*@ret_status 2). */
static int client_parse(const char *verb, const char *usage, int argc, char **argv,
                        struct client_opts *o, int *ret_status)
{
    static const struct conch_cli_opt table[] = {
        {"socket", 0, true, OPT_SOCKET},
        {"json", 0, false, OPT_JSON},
        {NULL, 0, false, 0},
    };
    const struct conch_cli_parser p = {
        .verb = verb, .table = table, .handler = client_opt, .ctx = o};
    struct conch_err err = {0};
    int optind = 1;
    memset(o, 0, sizeof(*o));
    int r = conch_cli_opts_parse(&p, argc, argv, &optind, &err);
    if (r == 1) {
        fputs(usage, stdout);
        *ret_status = 0;
        return -1;
    }
    if (r < 0) {
        *ret_status = conch_cli_usage_error(verb, usage, "%s", err.msg);
        return -1;
    }
    return optind;
}

static void print_json(json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s)
        puts(s);
    free(s);
}

double conch_cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void conch_cli_format_age(double s, char *buf, size_t size)
{
    if (s < 0)
        s = 0;
    if (s < 120)
        snprintf(buf, size, "%ds", (int)s);
    else if (s < 7200)
        snprintf(buf, size, "%dm", (int)(s / 60));
    else if (s < 172800)
        snprintf(buf, size, "%dh", (int)(s / 3600));
    else
        snprintf(buf, size, "%dd", (int)(s / 86400));
}

/* How many entries of @list belong to sandbox @id and are live: @key true (jobs' "running"),
 * or, with @key_is_bool false, @key not "ended" (sessions' "state"). */
static int count_for(json_t *list, const char *id, const char *key, bool key_is_bool)
{
    int n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e)
    {
        if (!id || strcmp(json_string_value(json_object_get(e, "sandbox")) ?: "", id))
            continue;
        json_t *v = json_object_get(e, key);
        n += key_is_bool ? json_is_true(v) : strcmp(json_string_value(v) ?: "", "ended") != 0;
    }
    return n;
}

int conch_cli_ps(int argc, char **argv)
{
    static const char usage[] = "usage: conch ps [--socket PATH] [--json]\n"
                                "List the daemon's sandboxes (--json: the sandbox.list result).\n";
    struct client_opts o;
    int status;
    int first = client_parse("ps", usage, argc, argv, &o, &status);
    if (first < 0)
        return status;
    if (first < argc) {
        fprintf(stderr, "conch ps: unexpected argument '%s'\n%s", argv[first], usage);
        return CONCH_EXIT_USAGE;
    }
    const char *sock = o.sock;
    bool json = o.json;
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, sock) < 0)
        return CONCH_EXIT_INFRA;
    json_t *res = conch_cli_conn_call(&c, "sandbox.list", json_object());
    if (!res || json)
        conch_cli_conn_close(&c);
    if (!res)
        return 1;
    if (json) {
        print_json(res);
        json_decref(res);
        return 0;
    }
    /* What runs now: jobs and sessions, counted per sandbox. */
    json_t *jobs = conch_cli_conn_call(&c, "job.list", json_object());
    json_t *sessions = conch_cli_conn_call(&c, "session.list", json_object());
    conch_cli_conn_close(&c);
    double now = conch_cli_now();
    printf("%-14s %-16s %-8s %6s %4s %4s  %-40s %s\n", "ID", "NAME", "STATE", "AGE", "JOBS", "SESS",
           "COMMAND", "WORKSPACE");
    size_t i;
    json_t *sb;
    json_array_foreach(json_object_get(res, "sandboxes"), i, sb)
    {
        const char *id = json_string_value(json_object_get(sb, "id"));
        const char *ws = json_string_value(json_object_get(sb, "workspace"));
        const char *name = json_string_value(json_object_get(sb, "name"));
        const char *cmd = json_string_value(json_object_get(sb, "current_command"));
        _cleanup_free_ char *qname = name ? conch_ws_quote("", name, false) : NULL;
        _cleanup_free_ char *qws = ws ? conch_ws_quote("", ws, false) : NULL;
        _cleanup_free_ char *qcmd = cmd ? conch_ws_quote("", cmd, false) : NULL;
        if (qcmd && strlen(qcmd) > 40)
            strcpy(qcmd + 37, "...");
        char age[16];
        conch_cli_format_age(now - json_number_value(json_object_get(sb, "created_at")), age,
                             sizeof(age));
        printf("%-14s %-16s %-8s %6s %4d %4d  %-40s %s\n", id ? id : "?", qname ? qname : "-",
               json_string_value(json_object_get(sb, "state")), age,
               count_for(json_object_get(jobs, "jobs"), id, "running", true),
               count_for(json_object_get(sessions, "sessions"), id, "state", false),
               qcmd ? qcmd : "-", qws ? qws : "-");
    }
    json_decref(jobs);
    json_decref(sessions);
    json_decref(res);
    return 0;
}

int conch_cli_rm(int argc, char **argv)
{
    static const char usage[] =
        "usage: conch rm [--socket PATH] [--json] ID...\n"
        "Destroy daemon sandboxes (ids or names), dropping their uncommitted changes;\n"
        "--json prints {\"destroyed\": [ids], \"failed\": [ID arguments]}.\n";
    struct client_opts o;
    int status;
    int i = client_parse("rm", usage, argc, argv, &o, &status);
    if (i < 0)
        return status;
    status = 0;
    if (i >= argc) {
        fputs(usage, stderr);
        return CONCH_EXIT_USAGE;
    }
    const char *sock = o.sock;
    bool json = o.json;
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, sock) < 0)
        return CONCH_EXIT_INFRA;
    json_t *destroyed = json_array(), *failed = json_array();
    for (; i < argc; i++) {
        char sid[128];
        json_t *res = NULL;
        if (conch_cli_resolve(&c, argv[i], sid, sizeof(sid)) == 0)
            res = conch_cli_conn_call(&c, "sandbox.destroy", json_pack("{s:s}", "id", sid));
        if (!res)
            status = 1;
        json_array_append_new(res ? destroyed : failed, json_string(res ? sid : argv[i]));
        json_decref(res);
    }
    conch_cli_conn_close(&c);
    if (json) {
        json_t *out = json_pack("{s:o,s:o}", "destroyed", destroyed, "failed", failed);
        print_json(out);
        json_decref(out);
    } else {
        json_decref(destroyed);
        json_decref(failed);
    }
    return status;
}

int conch_cli_start(int argc, char **argv)
{
    static const char usage[] =
        "usage: conch start [--socket PATH] [--json] ID...\n"
        "Start stopped daemon sandboxes (ids or names) again, as they were: their workspace\n"
        "changes, limits and environment (a sandbox stops when its processes die, e.g. in a\n"
        "daemon restart). Prints each id (--json: the sandbox objects); a running one is left\n"
        "as it is.\n";
    struct client_opts o;
    int status;
    int i = client_parse("start", usage, argc, argv, &o, &status);
    if (i < 0)
        return status;
    if (i >= argc)
        return conch_cli_usage_error("start", usage, "no sandbox given");
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0)
        return CONCH_EXIT_INFRA;
    status = 0;
    json_t *started = json_array();
    for (; i < argc; i++) {
        char sid[128];
        json_t *res = NULL;
        if (conch_cli_resolve(&c, argv[i], sid, sizeof(sid)) == 0)
            res = conch_cli_conn_call(&c, "sandbox.start", json_pack("{s:s}", "id", sid));
        if (!res) {
            status = 1;
            continue;
        }
        if (!o.json)
            puts(sid);
        json_array_append_new(started, res);
    }
    conch_cli_conn_close(&c);
    if (o.json) {
        json_t *out = json_pack("{s:o}", "sandboxes", started);
        print_json(out);
        json_decref(out);
    } else {
        json_decref(started);
    }
    return status;
}
