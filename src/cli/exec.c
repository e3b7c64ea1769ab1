/* exec.c - `conch exec`: a command in a daemon sandbox, as `docker exec` runs one in a
 * container. Without -t: exec.run with stream (output printed as it comes), stdin forwarded
 * when it is not a terminal (or with -i), Ctrl-C and SIGTERM/SIGHUP forwarded by exec.signal
 * (what the command printed until then is kept). With -t: a session (a terminal of the
 * sandbox) running the command, as `conch shell` drives one. */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/opts.h"
#include "core/cleanup.h"
#include "core/fsutil.h"

static const char usage[] =
    "usage: conch exec [options] SANDBOX [--] CMD [ARGS...]\n"
    "\n"
    "Run CMD in the daemon sandbox SANDBOX (an id or a name), as docker exec does, and exit\n"
    "with its status. Output is printed as it comes; Ctrl-C goes to the command.\n"
    "\n"
    "  -i, --interactive   forward stdin (done anyway when stdin is not a terminal)\n"
    "  -n, --no-stdin      do not read stdin (as ssh -n): for a caller whose stdin is a pipe\n"
    "                      it never closes, which would otherwise be waited for\n"
    "  -t, --tty           run CMD on a terminal of the sandbox (-it for a shell or a REPL;\n"
    "                      Ctrl-\\ Ctrl-\\ detaches, the session goes on)\n"
    "  --env K=V           add an environment variable (repeatable)\n"
    "  -w, --cwd DIR       working directory inside the sandbox (default /workspace; a\n"
    "                      relative DIR is under /workspace)\n"
    "  --timeout S         stop CMD after S seconds (SIGTERM, then SIGKILL): exit status 124\n"
    "  -d, --detach        run CMD as a background job and print its id (conch logs JOB)\n"
    "  --socket PATH       the daemon's socket\n"
    "  --json              print the whole exec.run result instead of the output\n"
    "\n"
    "Exit status: the command's; 124 timeout; 125 the daemon could not be reached or the\n"
    "command could not be run there; 2 usage error; 128+N killed by signal N.\n";

enum {
    OPT_SOCKET = 1,
    OPT_JSON,
    OPT_INTERACTIVE,
    OPT_NO_STDIN,
    OPT_TTY,
    OPT_CWD,
    OPT_TIMEOUT,
    OPT_DETACH
};

static const struct conch_cli_opt exec_opts[] = {
    {"socket", 0, true, OPT_SOCKET},
    {"json", 0, false, OPT_JSON},
    {"interactive", 'i', false, OPT_INTERACTIVE},
    {"no-stdin", 'n', false, OPT_NO_STDIN},
    {"tty", 't', false, OPT_TTY},
    {"cwd", 'w', true, OPT_CWD},
    {"detach", 'd', false, OPT_DETACH},
    {"timeout", 0, true, OPT_TIMEOUT},
    {NULL, 0, false, 0},
};

struct exec_cli {
    const char *sock;
    bool json, interactive, no_stdin, tty, detach;
    const char *cwd;
    uint64_t timeout_ms;
    bool has_timeout;
};

static int exec_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct exec_cli *o = ctx;
    switch (key) {
    case OPT_SOCKET:
        o->sock = value;
        break;
    case OPT_JSON:
        o->json = true;
        break;
    case OPT_INTERACTIVE:
        o->interactive = true;
        break;
    case OPT_NO_STDIN:
        o->no_stdin = true;
        break;
    case OPT_TTY:
        o->tty = true;
        break;
    case OPT_DETACH:
        o->detach = true;
        break;
    case OPT_CWD:
        o->cwd = value;
        break;
    case OPT_TIMEOUT:
        o->has_timeout = true;
        return conch_cli_parse_seconds(value, "--timeout", &o->timeout_ms, err);
    }
    return 0;
}

/* Quote @s for bash: 'it'\''s'. */
static int append_quoted(char **buf, size_t *len, const char *s)
{
    size_t need = *len + strlen(s) * 4 + 4;
    char *nb = realloc(*buf, need);
    if (!nb)
        return -1;
    *buf = nb;
    char *p = *buf + *len;
    *p++ = '\'';
    for (; *s; s++) {
        if (*s == '\'') {
            memcpy(p, "'\\''", 4);
            p += 4;
        } else {
            *p++ = *s;
        }
    }
    *p++ = '\'';
    *p++ = ' ';
    *p = '\0';
    *len = (size_t)(p - *buf);
    return 0;
}

/* The most stdin forwarded: it travels in the request, under the daemon's message cap. */
#define STDIN_MAX (12u << 20)

/* All of stdin, as a JSON string (taken by the caller), or NULL after printing why. */
static json_t *read_stdin(void)
{
    _cleanup_free_ char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            if (cap >= STDIN_MAX) {
                fprintf(stderr,
                        "conch exec: stdin is larger than %u MiB: copy it in with 'conch cp' "
                        "and redirect from the file\n",
                        STDIN_MAX >> 20);
                return NULL;
            }
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap + 1);
            if (!nb)
                return NULL;
            buf = nb;
        }
        ssize_t n = read(STDIN_FILENO, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            fprintf(stderr, "conch exec: read stdin: %s\n", strerror(errno));
            return NULL;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    json_t *s = json_stringn(buf ? buf : "", len);
    if (!s)
        fputs("conch exec: stdin is not UTF-8 text (binary input: copy it in with 'conch cp' "
              "and redirect from the file)\n",
              stderr);
    return s;
}

static volatile sig_atomic_t pending_sig;

static void on_signal(int sig)
{
    pending_sig = sig;
}

static const char *sig_name(int sig)
{
    return sig == SIGINT ? "INT" : sig == SIGHUP ? "HUP" : "TERM";
}

/* Print what the command's result says when it did not run as asked (it could not start,
 * a limit or the sandbox stopped it): the command's own failure is its own stderr. */
static void print_result_error(json_t *res)
{
    json_t *e = json_object_get(res, "error");
    const char *kind = json_string_value(json_object_get(e, "kind"));
    const char *msg = json_string_value(json_object_get(e, "message"));
    if (!kind || !msg ||
        (!strcmp(kind, "command") && !json_is_true(json_object_get(e, "not_started"))))
        return;
    if (json_is_true(json_object_get(e, "not_started")))
        fprintf(stderr, "conch exec: cannot run the command: %s\n", msg);
    else if (!strcmp(kind, "timeout"))
        fprintf(stderr, "conch exec: %s\n", msg);
    else
        fprintf(stderr, "conch exec: error (%s): %s\n", kind, msg);
}

/*
 * Send exec.run with streaming and print its exec.output notifications as they come; forward
 * SIGINT, SIGTERM and SIGHUP to the command. Returns the result (a new reference), or NULL
 * after printing why.
 */
static json_t *run_streamed(struct conch_cli_conn *c, const char *sid, json_t *params)
{
    int id;
    if (conch_cli_conn_send(c, "exec.run", params, &id) < 0) {
        fprintf(stderr, "conch exec: write to the daemon: %s\n", strerror(errno));
        return NULL;
    }
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &old);
    struct sigaction sa = {.sa_handler = on_signal}, saved[3];
    sigaction(SIGINT, &sa, &saved[0]);
    sigaction(SIGTERM, &sa, &saved[1]);
    sigaction(SIGHUP, &sa, &saved[2]);
    json_t *res = NULL;
    for (;;) {
        json_t *msg;
        bool done = false;
        while (!done && (msg = conch_cli_conn_next(c, false))) {
            json_t *jid = json_object_get(msg, "id");
            const char *m = json_string_value(json_object_get(msg, "method"));
            json_t *p = json_object_get(msg, "params");
            if (m && !strcmp(m, "exec.output") &&
                json_integer_value(json_object_get(p, "request_id")) == id) {
                json_t *d = json_object_get(p, "data");
                bool err = !strcmp(json_string_value(json_object_get(p, "stream")) ?: "", "stderr");
                if (conch_write_all(err ? STDERR_FILENO : STDOUT_FILENO, json_string_value(d),
                                    json_string_length(d)) < 0) {
                    /* our reader is gone (a closed pipe): the command goes on to its end */
                }
            } else if (json_is_integer(jid) && json_integer_value(jid) == id) {
                res = json_incref(json_object_get(msg, "result"));
                if (!res) {
                    json_t *e = json_object_get(msg, "error");
                    const char *msgtext = json_string_value(json_object_get(e, "message"));
                    _cleanup_free_ char *text = conch_cli_error_text(msgtext ? msgtext : "failed");
                    fprintf(stderr, "conch exec: %s\n", text ? text : "failed");
                }
                done = true;
            }
            json_decref(msg);
        }
        if (done)
            break;
        if (pending_sig) {
            int sig = pending_sig;
            pending_sig = 0;
            conch_cli_conn_send(c, "exec.signal",
                                json_pack("{s:s,s:i,s:s}", "sandbox", sid, "request_id", id,
                                          "signal", sig_name(sig)),
                                NULL);
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int r = ppoll(&pfd, 1, NULL, &old);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 || !conch_cli_conn_fill(c)) {
            fprintf(stderr, "conch exec: the daemon closed the connection\n");
            break;
        }
    }
    sigaction(SIGINT, &saved[0], NULL);
    sigaction(SIGTERM, &saved[1], NULL);
    sigaction(SIGHUP, &saved[2], NULL);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return res;
}

int conch_cli_exec(int argc, char **argv)
{
    struct exec_cli o = {0};
    struct conch_sandbox_spec spec; /* only its env (--env), parsed as conch create parses it */
    conch_spec_defaults(&spec);
    const struct conch_cli_parser p = {.verb = "exec",
                                       .table = exec_opts,
                                       .handler = exec_opt,
                                       .ctx = &o,
                                       .spec_opts = CONCH_SPEC_OPT_ENV,
                                       .spec = &spec};
    struct conch_err err = {0};
    int i = 1;
    int r = conch_cli_opts_parse(&p, argc, argv, &i, &err);
    if (r != 0) {
        conch_spec_done(&spec);
        if (r == 1) {
            fputs(usage, stdout);
            return 0;
        }
        return conch_cli_usage_error("exec", usage, "%s", err.msg);
    }
    if (i >= argc) {
        conch_spec_done(&spec);
        return conch_cli_usage_error("exec", usage, "no sandbox given");
    }
    const char *ref = argv[i++];
    if (i < argc && !strcmp(argv[i], "--"))
        i++;
    if (i >= argc) {
        conch_spec_done(&spec);
        return conch_cli_usage_error("exec", usage, "no command given");
    }
    if ((o.tty && o.json) || (o.detach && (o.tty || o.has_timeout))) {
        conch_spec_done(&spec);
        return conch_cli_usage_error("exec", usage,
                                     o.detach ? "-d goes with neither -t nor --timeout"
                                              : "-t and --json do not go together");
    }
    json_t *env = json_incref(spec.env);
    conch_spec_done(&spec);
    char *cmd = NULL;
    size_t len = 0;
    for (; i < argc; i++)
        if (append_quoted(&cmd, &len, argv[i]) < 0) {
            free(cmd);
            json_decref(env);
            return 1;
        }
    json_t *probe = json_string(cmd);
    if (!probe) { /* jansson takes UTF-8 only: say so rather than send nothing */
        fprintf(stderr, "conch exec: the command is not UTF-8 text: %s\n", strerror(EILSEQ));
        free(cmd);
        json_decref(env);
        return CONCH_EXIT_USAGE;
    }
    json_decref(probe);
    /* stdin: read before anything runs (the request carries it). A terminal is read only
     * when asked (-i); with -t the terminal is the session's keyboard. */
    json_t *in = NULL;
    if (!o.tty && !o.no_stdin && (o.interactive || !isatty(STDIN_FILENO))) {
        in = read_stdin();
        if (!in) {
            free(cmd);
            json_decref(env);
            return CONCH_EXIT_USAGE;
        }
    }
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0) {
        free(cmd);
        json_decref(env);
        json_decref(in);
        return CONCH_EXIT_INFRA;
    }
    char sid[128];
    int status = CONCH_EXIT_INFRA;
    if (conch_cli_resolve(&c, ref, sid, sizeof(sid)) < 0)
        goto out;
    if (o.tty) {
        status = conch_cli_tty_exec(&c, sid, cmd, env, o.cwd);
        goto out;
    }
    json_t *params = json_pack("{s:s,s:s,s:o}", "sandbox", sid, "command", cmd, "env",
                               env ? json_incref(env) : json_object());
    if (!params)
        goto out;
    if (in)
        json_object_set(params, "stdin", in);
    if (o.cwd)
        json_object_set_new(params, "cwd", json_string(o.cwd));
    if (o.detach) {
        json_t *job = conch_cli_conn_call(&c, "job.start", params);
        if (job) {
            puts(json_string_value(json_object_get(job, "job_id")) ?: "");
            status = 0;
        }
        json_decref(job);
        goto out;
    }
    /* As docker exec: no time limit unless asked (exec.run's default is 120 s). */
    json_object_set_new(params, "timeout",
                        json_real(o.has_timeout ? (double)o.timeout_ms / 1000.0 : 0));
    json_t *res;
    if (o.json) {
        res = conch_cli_conn_call(&c, "exec.run", params);
    } else {
        json_object_set_new(params, "stream", json_true());
        json_object_set_new(params, "changes", json_false());
        json_object_set_new(params, "max_output", json_integer(0)); /* printed as it came */
        res = run_streamed(&c, sid, params);
    }
    if (!res)
        goto out;
    status = (int)json_integer_value(json_object_get(res, "exit_code"));
    if (json_is_true(json_object_get(res, "timed_out")))
        status = CONCH_EXIT_TIMEOUT;
    if (o.json) {
        char *s = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
        if (s)
            puts(s);
        free(s);
    } else {
        print_result_error(res);
    }
    json_decref(res);
out:
    conch_cli_conn_close(&c);
    free(cmd);
    json_decref(env);
    json_decref(in);
    return status;
}
