/* js.c - `conch js SANDBOX`: JavaScript/TypeScript in a daemon sandbox's JS session
 * (js.eval, docs/PROTOCOL.md), printing each result's text (console lines, then `→ value`
 * or the error). With -e one eval of CODE; with code piped on standard input one eval of
 * all of it; on a terminal (or with -i) a REPL: a cell is read line by line until its
 * brackets, strings, templates and comments are closed, with the line editor of
 * lineedit.c (history, editing), `.exit`, `.reset`, `.help`; Ctrl-C at the prompt drops
 * the cell, during an eval cancels it (js.reset: the session starts afresh); Ctrl-D
 * leaves. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/lineedit.h"
#include "cli/opts.h"
#include "core/cleanup.h"
#include "core/strbuf.h"

struct js_opts {
    const char *sock, *code, *session;
    bool json;
    bool interactive;
    bool has_timeout;
    uint64_t timeout_ms;
};

enum { JS_SOCKET = 1, JS_JSON, JS_EVAL, JS_SESSION, JS_TIMEOUT, JS_INTERACTIVE };

static int js_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct js_opts *o = ctx;
    switch (key) {
    case JS_SOCKET:
        o->sock = value;
        break;
    case JS_JSON:
        o->json = true;
        break;
    case JS_EVAL:
        o->code = value;
        break;
    case JS_SESSION:
        o->session = value;
        break;
    case JS_INTERACTIVE:
        o->interactive = true;
        break;
    default:
        o->has_timeout = true;
        return conch_cli_parse_seconds(value, "--timeout", &o->timeout_ms, err);
    }
    return 0;
}

/* Read standard input whole into @sb. Returns 0 or -1 (printed). */
static int read_stdin(struct conch_sb *sb)
{
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), stdin)) > 0)
        conch_sb_putn(sb, buf, n);
    if (ferror(stdin) || sb->oom) {
        fputs("conch js: could not read the code from standard input\n", stderr);
        return -1;
    }
    return 0;
}

/* Whether @s is a whole cell: every bracket closed and no string, template literal or
 * comment left open. A closer with nothing open ends it too (the engine reports the error);
 * a `/` after an operator or an opening bracket starts a regular expression. */
static bool cell_complete(const char *s)
{
    char stack[256]; /* ( [ { , ` for a template's text, T for a ${ inside one */
    size_t depth = 0, n = strlen(s);
    char last = 0;
    for (size_t i = 0; i < n;) {
        char c = s[i], top = depth ? stack[depth - 1] : 0;
        if (top == '`') {
            if (c == '\\')
                i += 2;
            else if (c == '`')
                depth--, i++, last = '`';
            else if (c == '$' && s[i + 1] == '{')
                stack[depth++] = 'T', i += 2;
            else
                i++;
            continue;
        }
        if (c == '/' && s[i + 1] == '/') {
            while (i < n && s[i] != '\n')
                i++;
            continue;
        }
        if (c == '/' && s[i + 1] == '*') {
            const char *end = strstr(s + i + 2, "*/");
            if (!end)
                return false;
            i = (size_t)(end - s) + 2;
            continue;
        }
        if (c == '\'' || c == '"' ||
            (c == '/' && (!last || strchr("(,=:[!&|?{};+-*%<>~^", last)))) {
            bool cls = false; /* inside a regex's [...] */
            for (i++; i < n && s[i] != '\n'; i++) {
                if (s[i] == '\\') {
                    if (++i >= n)
                        return false; /* a line continued */
                } else if (c == '/' && s[i] == '[') {
                    cls = true;
                } else if (c == '/' && s[i] == ']') {
                    cls = false;
                } else if (s[i] == c && !cls) {
                    break;
                }
            }
            if (i >= n)
                return c == '/'; /* an open string waits; a lone `/` is the engine's to judge */
            last = c == '/' ? 'r' : c;
            i++;
            continue;
        }
        if (depth >= sizeof(stack) - 1)
            return true; /* the engine's to judge */
        if (c == '`' || c == '(' || c == '[' || c == '{') {
            stack[depth++] = c;
        } else if (c == ')' || c == ']' || c == '}') {
            if (!depth)
                return true;
            depth--;
            if (top == 'T') { /* back in the template's text */
                i++;
                last = '}';
                continue;
            }
        }
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            last = c;
        i++;
    }
    return depth == 0;
}

static volatile sig_atomic_t js_interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    js_interrupted = 1;
}

/* Print the daemon's error @e for a person. */
static void print_error(json_t *e)
{
    const char *code = json_string_value(json_object_get(json_object_get(e, "data"), "code"));
    const char *m = json_string_value(json_object_get(e, "message"));
    _cleanup_free_ char *text = conch_cli_error_text(m ? m : "unknown");
    fprintf(stderr, "conch js: error%s%s%s: %s\n", code ? " (" : "", code ? code : "",
            code ? ")" : "",
            text ? text
            : m  ? m
                 : "unknown");
}

/* Print an eval's result @res (its text, or its JSON with --json). Returns its exit status. */
static int print_result(const struct js_opts *o, json_t *res)
{
    int status = json_is_true(json_object_get(res, "ok")) ? 0 : 1;
    if (o->json) {
        char *text = json_dumps(res, JSON_COMPACT);
        if (text)
            puts(text);
        free(text);
    } else {
        if (json_is_true(json_object_get(res, "restarted")))
            fprintf(stderr, "conch js: %s: a fresh session\n",
                    json_string_value(json_object_get(res, "restart_reason")));
        const char *text = json_string_value(json_object_get(res, "text"));
        if (text && *text)
            printf("%s%s", text, text[strlen(text) - 1] == '\n' ? "" : "\n");
    }
    fflush(stdout);
    return status;
}

static json_t *session_params(const char *sid, const struct js_opts *o)
{
    json_t *params = json_pack("{s:s}", "sandbox", sid);
    if (params && o->session)
        json_object_set_new(params, "session", json_string(o->session));
    return params;
}

/* One cell of the REPL: js.eval of @code, waiting for its answer; Ctrl-C meanwhile (a key
 * read from the terminal @le, raw, or a SIGINT) sends js.reset, which cancels it; other keys
 * typed meanwhile wait in @le for the next line. Returns 0 (answered, printed) or -1 (the
 * daemon is gone). */
static int repl_eval(struct conch_cli_conn *c, struct conch_cli_lineedit *le, const char *sid,
                     const struct js_opts *o, const char *code)
{
    json_t *params = session_params(sid, o);
    if (params)
        json_object_set_new(params, "code", json_string(code));
    if (params && o->has_timeout)
        json_object_set_new(params, "timeout", json_real((double)o->timeout_ms / 1000.0));
    int id, reset_id = -1;
    if (conch_cli_conn_send(c, "js.eval", params, &id) < 0) {
        fprintf(stderr, "conch js: write to the daemon: %s\n", strerror(errno));
        return -1;
    }
    bool eval_done = false, reset_done = false;
    bool watch_keys = le->tty && le->raw;
    while (!eval_done || (reset_id >= 0 && !reset_done)) {
        json_t *msg = conch_cli_conn_next(c, false);
        if (!msg) {
            if (js_interrupted && reset_id < 0 && !eval_done) {
                fputs("^C: cancelling the eval (js.reset: the session starts afresh)\n", stderr);
                if (conch_cli_conn_send(c, "js.reset", session_params(sid, o), &reset_id) < 0) {
                    fprintf(stderr, "conch js: write to the daemon: %s\n", strerror(errno));
                    return -1;
                }
                continue;
            }
            struct pollfd p[2] = {{.fd = c->fd, .events = POLLIN},
                                  {.fd = le->in, .events = POLLIN}};
            bool keys = watch_keys && reset_id < 0 && !eval_done;
            if (poll(p, keys ? 2 : 1, -1) < 0) {
                if (errno == EINTR)
                    continue;
                fprintf(stderr, "conch js: poll: %s\n", strerror(errno));
                return -1;
            }
            if (keys && p[1].revents) {
                int k = conch_cli_lineedit_take_keys(le);
                if (k == 1)
                    js_interrupted = 1;
                else if (k < 0 || (p[1].revents & (POLLHUP | POLLERR | POLLNVAL)))
                    watch_keys = false; /* the terminal is gone: the daemon's answer still comes */
                if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
                    continue;
            }
            if (!conch_cli_conn_fill(c)) {
                fputs("conch js: the daemon closed the connection\n", stderr);
                return -1;
            }
            continue;
        }
        json_t *jid = json_object_get(msg, "id");
        json_int_t mid = json_is_integer(jid) ? json_integer_value(jid) : -2;
        json_t *res = json_object_get(msg, "result");
        if (mid == id) {
            eval_done = true;
            if (res)
                print_result(o, res);
            else if (reset_id < 0)
                print_error(json_object_get(msg, "error"));
        } else if (mid == reset_id) {
            reset_done = true;
            if (!res)
                print_error(json_object_get(msg, "error"));
        }
        json_decref(msg);
    }
    if (reset_id >= 0)
        fputs("(cancelled; the session was reset)\n", stderr);
    return 0;
}

static const char repl_help[] =
    "Type JavaScript or TypeScript; a cell runs once its brackets and strings are closed.\n"
    "Globals persist between cells; the last expression's value is shown (-> value).\n"
    "  .reset   a fresh session (globals dropped)\n"
    "  .exit    leave (or Ctrl-D)\n"
    "  .help    this text\n"
    "Ctrl-C drops the cell being typed, or cancels a running eval (the session is reset).\n"
    "Up/Down: history; Left/Right, Home/End, Ctrl-A/E/K/U/W: editing.\n";

/* The REPL on standard input. Returns the exit status. */
static int repl(struct conch_cli_conn *c, const char *sid, const struct js_opts *o)
{
    struct conch_cli_lineedit le;
    conch_cli_lineedit_init(&le, STDIN_FILENO, STDOUT_FILENO, stdin);
    if (le.tty)
        printf("conch js: session '%s' of sandbox %s (.help for help, .exit or Ctrl-D to "
               "leave)\n",
               o->session ? o->session : "default", sid);
    struct sigaction sa = {.sa_handler = on_sigint}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    struct conch_sb cell = {0};
    int status = 0;
    for (;;) {
        fflush(stdout);
        fflush(stderr);
        /* Cleared before the line is read: a Ctrl-C typed after the line (a key read by
         * repl_eval, the terminal staying raw) or a SIGINT cancels the cell's eval. */
        js_interrupted = 0;
        char *line = NULL;
        int r = conch_cli_lineedit_read(&le, cell.len ? "... " : "js> ", &line);
        if (r == -EINTR) {
            conch_sb_trunc(&cell, 0);
            continue;
        }
        if (r <= 0) {
            if (r < 0)
                fprintf(stderr, "conch js: read: %s\n", strerror(-r));
            /* A cell left open at the end still runs: the engine says what is missing. */
            if (r == 0 && cell.len && !le.tty) {
                conch_sb_putn(&cell, "", 1);
                if (repl_eval(c, &le, sid, o, cell.buf) < 0)
                    status = CONCH_EXIT_INFRA;
            }
            break;
        }
        const char *t = line + strspn(line, " \t");
        if (!cell.len && t[0] == '.') {
            size_t k = strcspn(t, " \t");
            if (k == 5 && !strncmp(t, ".exit", 5)) {
                free(line);
                break;
            }
            if (k == 6 && !strncmp(t, ".reset", 6)) {
                json_t *res = conch_cli_conn_call(c, "js.reset", session_params(sid, o));
                if (res)
                    puts("(the session was reset)");
                json_decref(res);
            } else if (k == 5 && !strncmp(t, ".help", 5)) {
                fputs(repl_help, stdout);
            } else {
                printf("unknown command '%.*s' (.help, .reset, .exit)\n", (int)k, t);
            }
            conch_cli_lineedit_add(&le, line);
            free(line);
            continue;
        }
        conch_cli_lineedit_add(&le, line);
        conch_sb_puts(&cell, line);
        conch_sb_putn(&cell, "\n", 2); /* the NUL kept past len */
        cell.len--;
        free(line);
        if (cell.oom) {
            fputs("conch js: out of memory\n", stderr);
            status = CONCH_EXIT_INFRA;
            break;
        }
        if (!cell_complete(cell.buf))
            continue;
        if (cell.buf[strspn(cell.buf, " \t\r\n")]) {
            if (repl_eval(c, &le, sid, o, cell.buf) < 0) {
                status = CONCH_EXIT_INFRA;
                break;
            }
        }
        conch_sb_trunc(&cell, 0);
    }
    sigaction(SIGINT, &old, NULL);
    conch_sb_done(&cell);
    conch_cli_lineedit_done(&le);
    return status;
}

int conch_cli_js(int argc, char **argv)
{
    static const char usage[] =
        "usage: conch js [--socket PATH] [--json] SANDBOX [-e CODE] [-i] [--session NAME]\n"
        "                [--timeout SECONDS]\n"
        "Run JavaScript or TypeScript in the sandbox's JS session (default \"default\"):\n"
        "globals persist between runs of a session; readFile/writeFile see the sandbox's\n"
        "files and tools.NAME(input) calls the tools registered on it. Prints the console\n"
        "lines and the value (-> value) or the error; exits 1 when the code threw.\n"
        "Without -e: on a terminal, a REPL (multi-line cells, history, .help, .reset, .exit;\n"
        "Ctrl-C cancels a running eval, Ctrl-D leaves); else the code is read from standard\n"
        "input, or with -i read as REPL cells line by line. --timeout 0: none (default 60 s).\n";
    static const struct conch_cli_opt table[] = {
        {"socket", 0, true, JS_SOCKET},
        {"json", 0, false, JS_JSON},
        {"eval", 'e', true, JS_EVAL},
        {"session", 0, true, JS_SESSION},
        {"timeout", 0, true, JS_TIMEOUT},
        {"interactive", 'i', false, JS_INTERACTIVE},
        {NULL, 0, false, 0},
    };
    struct js_opts o = {0};
    const struct conch_cli_parser p = {.verb = "js", .table = table, .handler = js_opt, .ctx = &o};
    struct conch_err err = {0};
    int i = 1;
    int r = conch_cli_opts_parse(&p, argc, argv, &i, &err);
    int j = 1;
    /* Options may follow the sandbox too. */
    if (r == 0 && i < argc)
        r = conch_cli_opts_parse(&p, argc - i, argv + i, &j, &err);
    if (r == 1) {
        fputs(usage, stdout);
        return 0;
    }
    if (r < 0)
        return conch_cli_usage_error("js", usage, "%s", err.msg);
    if (i >= argc)
        return conch_cli_usage_error("js", usage, "no sandbox given");
    if (i + j < argc)
        return conch_cli_usage_error("js", usage, "unexpected '%s' (the code goes in -e CODE)",
                                     argv[i + j]);
    struct conch_sb code = {0};
    bool interactive = !o.code && (o.interactive || isatty(STDIN_FILENO));
    if (!o.code && !interactive) {
        if (read_stdin(&code) < 0) {
            conch_sb_done(&code);
            return CONCH_EXIT_INFRA;
        }
        conch_sb_putn(&code, "", 1);
        o.code = code.buf;
    }
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0) {
        conch_sb_done(&code);
        return CONCH_EXIT_INFRA;
    }
    char sid[128];
    json_t *res = NULL;
    if (interactive) {
        int status = conch_cli_resolve(&c, argv[i], sid, sizeof(sid)) == 0 ? repl(&c, sid, &o)
                                                                           : CONCH_EXIT_INFRA;
        conch_cli_conn_close(&c);
        return status;
    }
    if (conch_cli_resolve(&c, argv[i], sid, sizeof(sid)) == 0) {
        json_t *params = json_pack("{s:s,s:s}", "sandbox", sid, "code", o.code);
        if (params && o.session)
            json_object_set_new(params, "session", json_string(o.session));
        if (params && o.has_timeout)
            json_object_set_new(params, "timeout", json_real((double)o.timeout_ms / 1000.0));
        res = conch_cli_conn_call(&c, "js.eval", params);
    }
    conch_cli_conn_close(&c);
    conch_sb_done(&code);
    if (!res)
        return CONCH_EXIT_INFRA;
    int status = print_result(&o, res);
    json_decref(res);
    return status;
}
